// plan_reads on handmade checkpoints: file order, coalescing and its gap and span rules,
// cutting long storages, tied storages read once, zero-length and data-less storages, and
// selection by key (tensor), quantizer tensors included.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "model/read_plan.h"

using ckpt::checkpoint;
using ckpt::detail::plan_reads;
using ckpt::detail::read_plan;
using ckpt::detail::read_plan_options;

namespace {

// Storages at (offset, nbytes); offset < 0: no data in the file (a meta storage).
checkpoint with_storages(const std::vector<std::pair<int64_t, uint64_t>>& layout) {
  checkpoint c;
  c.files.emplace_back();  // planning reads no bytes: a file without a source will do
  for (size_t i = 0; i < layout.size(); ++i) {
    ckpt::storage_record s;
    s.key = std::to_string(i);
    s.nbytes = layout[i].second;
    if (layout[i].first >= 0) s.file_offset = uint64_t(layout[i].first);
    c.storages.push_back(s);
  }
  return c;
}

std::vector<bool> all(const checkpoint& c) { return std::vector<bool>(c.storages.size(), true); }

// "offset+nbytes:storage@read_offset/nbytes,..." per read, for compact expectations.
std::vector<std::string> describe(const read_plan& p) {
  std::vector<std::string> out;
  for (const auto& op : p.reads) {
    std::string s = std::to_string(op.offset) + "+" + std::to_string(op.nbytes) + ":";
    for (size_t k = op.first_piece; k < op.first_piece + op.piece_count; ++k) {
      const auto& piece = p.pieces[k];
      s += (k == op.first_piece ? "" : ",") + std::to_string(piece.storage) + "@" + std::to_string(piece.read_offset) +
           "/" + std::to_string(piece.nbytes);
      if (piece.storage_offset) s += "<" + std::to_string(piece.storage_offset);
    }
    out.push_back(s);
  }
  return out;
}

using strings = std::vector<std::string>;

}  // namespace

TEST_CASE("reads come in file order whatever the storage order") {
  checkpoint c = with_storages({{3000, 100}, {0, 100}, {1500, 100}});
  read_plan p = plan_reads(c, all(c), {/*max_gap=*/0});
  CHECK(describe(p) == strings{"0+100:1@0/100", "1500+100:2@0/100", "3000+100:0@0/100"});
  CHECK(p.storages == std::vector<size_t>{0, 1, 2});
  CHECK(p.storage_bytes == 300);
}

TEST_CASE("neighbours share a read across gaps up to max_gap, and no further") {
  // Gaps of 64 (a zip local header), exactly max_gap, and one byte more.
  checkpoint c = with_storages({{0, 100}, {164, 100}, {364, 50}, {515, 10}});
  read_plan_options o;
  o.max_gap = 100;
  read_plan p = plan_reads(c, all(c), o);
  CHECK(describe(p) == strings{"0+414:0@0/100,1@164/100,2@364/50", "515+10:3@0/10"});
  CHECK(p.storage_bytes == 260);  // gap bytes are read, not landed

  SUBCASE("adjacent storages share a read even with max_gap 0") {
    checkpoint d = with_storages({{0, 8}, {8, 8}, {17, 8}});
    CHECK(describe(plan_reads(d, all(d), {0})) == strings{"0+16:0@0/8,1@8/8", "17+8:2@0/8"});
  }
}

TEST_CASE("a shared read stops at max_shared_read and max_read") {
  checkpoint c = with_storages({{0, 40}, {40, 40}, {80, 40}, {120, 40}});
  read_plan_options o;
  o.max_shared_read = 100;
  CHECK(describe(plan_reads(c, all(c), o)) == strings{"0+80:0@0/40,1@40/40", "80+80:2@0/40,3@40/40"});
  o.max_shared_read = 1000;
  o.max_read = 120;
  CHECK(describe(plan_reads(c, all(c), o)) == strings{"0+120:0@0/40,1@40/40,2@80/40", "120+40:3@0/40"});
}

TEST_CASE("share_below and share_alignment keep storages out of shared reads") {
  checkpoint c = with_storages({{0, 64}, {64, 512}, {576, 64}, {640, 64}, {705, 10}});
  read_plan_options o;
  o.share_below = 512;      // storage 1 reads alone, and the read it starts takes no one
  o.share_alignment = 64;   // storage 4 is not 64-byte aligned
  CHECK(describe(plan_reads(c, all(c), o)) ==
        strings{"0+64:0@0/64", "64+512:1@0/512", "576+128:2@0/64,3@64/64", "705+10:4@0/10"});
}

TEST_CASE("storages longer than max_read are cut at multiples of max_read in the file") {
  checkpoint c = with_storages({{10, 250}, {260, 5}});
  read_plan_options o;
  o.max_read = 100;
  // Pieces end where the file offset crosses 100 and 200; storage 1 never joins a cut one.
  CHECK(describe(plan_reads(c, all(c), o)) ==
        strings{"10+90:0@0/90", "100+100:0@0/100<90", "200+60:0@0/60<190", "260+5:1@0/5"});
  SUBCASE("a storage no longer than max_read stays whole even across a multiple") {
    checkpoint d = with_storages({{50, 100}});
    CHECK(describe(plan_reads(d, all(d), o)) == strings{"50+100:0@0/100"});
  }
}

TEST_CASE("overlapping storages are not merged into one read") {
  checkpoint c = with_storages({{0, 100}, {50, 100}});
  CHECK(describe(plan_reads(c, all(c))) == strings{"0+100:0@0/100", "50+100:1@0/100"});
}

TEST_CASE("zero-length and data-less storages get a destination and no read") {
  checkpoint c = with_storages({{0, 0}, {-1, 16}, {64, 8}});
  read_plan p = plan_reads(c, all(c));
  CHECK(describe(p) == strings{"64+8:2@0/8"});
  CHECK(p.storages == std::vector<size_t>{0, 1, 2});
  CHECK(p.storage_bytes == 8);
}

TEST_CASE("selection: only the storages of the chosen keys, tied ones read once") {
  checkpoint c = with_storages({{0, 100}, {200, 100}, {400, 100}, {600, 100}});
  auto tensor_on = [](size_t storage) {
    ckpt::tensor_record t;
    t.storage = storage;
    return t;
  };
  c.tensors = {tensor_on(0), tensor_on(0), tensor_on(2), tensor_on(1)};  // 0 and 1 are tied
  // A per-channel quantized tensor on storage 3, whose scales live in storage 1.
  auto q = std::make_shared<ckpt::quantization>();
  q->scheme = "per_channel_affine";
  q->scales = std::make_shared<ckpt::tensor_record>(tensor_on(1));
  c.tensors.push_back(tensor_on(3));
  c.tensors.back().quant = q;

  std::vector<bool> tied = ckpt::detail::storages_of(c, {0, 1});
  CHECK(tied == std::vector<bool>{true, false, false, false});
  read_plan p = plan_reads(c, tied, {0});
  CHECK(describe(p) == strings{"0+100:0@0/100"});
  CHECK(p.storages == std::vector<size_t>{0});

  std::vector<bool> quantized = ckpt::detail::storages_of(c, {4});
  CHECK(quantized == std::vector<bool>{false, true, false, true});
  CHECK(describe(plan_reads(c, quantized, {0})) == strings{"200+100:1@0/100", "600+100:3@0/100"});

  CHECK(describe(plan_reads(c, std::vector<bool>(4, false))).empty());
  CHECK_THROWS(plan_reads(c, std::vector<bool>(3, true)));
}
