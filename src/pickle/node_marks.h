// Internal: a set of pickle nodes, one bit per node of a document (by value::id), with a
// hash set behind it for nodes the document did not make (renamed keys, hand-built nodes).
// rekey asks "is this node a tensor?" and "walked this node already?" of millions of nodes
// while the decoded tree is at its largest: a pointer_map costs ~40 bytes a member there,
// a bit costs 1/8 byte a node.
#pragma once

#include <cstdint>
#include <vector>

#include "base/pointer_map.h"
#include "ckpt/pickle.h"

namespace ckpt::detail {

class node_marks {
 public:
  explicit node_marks(const pickle::document& doc) : doc_(doc), bits_((doc.node_count() + 64) / 64, 0) {}

  /// Marks `v`; returns whether it was unmarked. A null node is never marked.
  bool insert(const pickle::value* v) {
    if (!v) return false;
    if (!mine(v)) return others_.insert(v, true);
    uint64_t& word = bits_[v->id / 64];
    const uint64_t bit = uint64_t(1) << (v->id % 64);
    if (word & bit) return false;
    word |= bit;
    return true;
  }
  bool contains(const pickle::value* v) const {
    if (!v) return false;
    if (!mine(v)) return others_.contains(v);
    return (bits_[v->id / 64] >> (v->id % 64)) & 1;
  }

 private:
  // Made by the document before this set was (a node made later has no bit).
  bool mine(const pickle::value* v) const { return doc_.owns(v) && v->id / 64 < bits_.size(); }
  const pickle::document& doc_;
  std::vector<uint64_t> bits_;  // ids run from 1 to node_count()
  pointer_map<bool> others_;
};

}  // namespace ckpt::detail
