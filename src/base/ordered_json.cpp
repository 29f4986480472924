#include "base/ordered_json.h"

#include <algorithm>
#include <deque>
#include <utility>
#include <vector>

namespace ckpt::detail {

using json = nlohmann::ordered_json;
using members_t = json::object_t::Container;  // ordered_map is a vector of (key, value)

namespace {

// ordered_map's element is pair<const string, json>, whose move copies the key and so may
// throw: a vector of those copies every member, subtree and all, each time it grows. So
// members are gathered as movable pairs and moved into the object once, here.
void move_members(std::vector<std::pair<std::string, json>>& from, json& object) {
  members_t& members = *object.get_ptr<json::object_t*>();
  members.reserve(members.size() + from.size());
  for (auto& [k, v] : from) members.emplace_back(std::move(k), std::move(v));
}

// A SAX handler that builds the value nlohmann's DOM parser would (json_sax_dom_parser),
// with one hash index per open object for its keys.
class dom_builder {
 public:
  dom_builder(size_t max_depth, const std::function<void(const json_failure&)>& fail,
              const left_out_members& leave_out)
      : max_depth_(max_depth), fail_(fail), leave_out_(leave_out) {}
  json take() { return std::move(root_); }

  bool null() { return skipped_scalar() || (put(nullptr), true); }
  bool boolean(bool v) { return skipped_scalar() || (put(v), true); }
  bool number_integer(json::number_integer_t v) { return skipped_scalar() || (put(v), true); }
  bool number_unsigned(json::number_unsigned_t v) { return skipped_scalar() || (put(v), true); }
  bool number_float(json::number_float_t v, const json::string_t&) { return skipped_scalar() || (put(v), true); }
  bool string(json::string_t& v) { return skipped_scalar() || (put(std::move(v)), true); }
  bool binary(json::binary_t& v) { return skipped_scalar() || (put(json::binary(std::move(v))), true); }
  bool start_object(std::size_t) { return skipped_open() || open(json::object()); }
  bool start_array(std::size_t) { return skipped_open() || open(json::array()); }
  bool end_object() { return skipped_close() || close(); }
  bool end_array() { return skipped_close() || close(); }

  bool key(json::string_t& k) {
    if (skipping_ > 0) return true;
    frame& f = open_.back();
    // A member leave_out names: nothing of it is kept, its value is skipped.
    const std::vector<std::string_view>& parent = leave_out_.parent;
    if (f.on_path == parent.size() && std::find(leave_out_.names.begin(), leave_out_.names.end(), k) != leave_out_.names.end()) {
      skip_next_ = true;
      return true;
    }
    path_key_ = f.on_path < parent.size() && k == parent[f.on_path];
    member_ = &f.member(std::move(k));
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    fail_({false, e.what()});
    return false;  // not reached: fail throws
  }

 private:
  // An object's members are gathered in a vector of their own and moved into the object
  // when it closes (move_members: copied on every growth, at every level of nesting, they
  // were 80% of inspecting a 1.2 MB program JSON).
  struct frame {
    json* value;
    std::vector<std::pair<std::string, json>> members;  // objects only
    // Key -> member position, made only once an object outgrows a scan: most objects of a
    // program JSON have a few members, and a hash table each cost more than its scans.
    std::unordered_map<std::string, size_t> index;
    size_t on_path;  // how many of leave_out's parent keys lead here, or kOffPath

    json& member(std::string&& k) {
      if (index.empty() && members.size() < kScanMembers) {
        for (auto& m : members)
          if (m.first == k) return m.second;
      } else {
        if (index.empty())
          for (size_t i = 0; i < members.size(); ++i) index.try_emplace(members[i].first, i);
        auto [at, fresh] = index.try_emplace(k, members.size());
        if (!fresh) return members[at->second].second;
      }
      members.emplace_back(std::move(k), nullptr);
      return members.back().second;
    }
  };
  static constexpr size_t kScanMembers = 16;
  static constexpr size_t kOffPath = SIZE_MAX;

  // The value after a left-out key: a scalar is dropped, a container counted until it closes.
  bool skipped_scalar() {
    if (skipping_ > 0) return true;
    if (!skip_next_) return false;
    skip_next_ = false;
    return true;
  }
  bool skipped_open() {
    if (skipping_ > 0 || skip_next_) {
      skip_next_ = false;
      ++skipping_;
      return true;
    }
    return false;
  }
  bool skipped_close() {
    if (skipping_ == 0) return false;
    --skipping_;
    return true;
  }

  // Where the next value goes: the root, the member whose key came last, or the end of the
  // open array. A pointer into a container is used only while that container is the
  // innermost open one, so the container's growth never invalidates one still in use.
  json* put(json&& v) {
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& parent = *open_.back().value;
    if (parent.is_array()) {
      json::array_t& items = *parent.get_ptr<json::array_t*>();
      items.push_back(std::move(v));
      return &items.back();
    }
    *member_ = std::move(v);
    return member_;
  }

  // The depth counts the containers around the new one, as nlohmann's parser callback does.
  bool open(json&& container) {
    if (open_.size() > max_depth_) fail_({true, "nested deeper than " + std::to_string(max_depth_) + " levels"});
    // Only an object reached through leave_out's parent keys, from the root, is on its path.
    size_t on_path = kOffPath;
    if (!leave_out_.names.empty() && container.is_object()) {
      if (open_.empty()) on_path = 0;
      else if (path_key_ && !open_.back().value->is_array()) on_path = open_.back().on_path + 1;
    }
    path_key_ = false;
    json* v = put(std::move(container));
    open_.push_back({v, {}, {}, on_path});
    return true;
  }

  bool close() {
    frame& f = open_.back();
    if (f.value->is_object()) move_members(f.members, *f.value);
    open_.pop_back();
    return true;
  }

  size_t max_depth_;
  const std::function<void(const json_failure&)>& fail_;
  const left_out_members& leave_out_;
  bool path_key_ = false;   // the last key continues leave_out's parent path
  bool skip_next_ = false;  // the next value is the left-out member's
  size_t skipping_ = 0;     // containers open inside a skipped value
  json root_;
  std::deque<frame> open_;  // never relocates a frame: member_ points into one
  json* member_ = nullptr;
};

}  // namespace

json parse_ordered_json(std::string_view text, size_t max_depth, const std::function<void(const json_failure&)>& fail,
                        const left_out_members& leave_out) {
  dom_builder builder(max_depth, fail, leave_out);
  // Strict: one value, then only whitespace.
  if (!json::sax_parse(text.data(), text.data() + text.size(), &builder)) fail({false, "not JSON"});
  return builder.take();
}

void ordered_object_builder::set(const std::string& key, json value) {
  auto [at, fresh] = at_.try_emplace(key, members_.size());
  if (fresh)
    members_.emplace_back(key, std::move(value));
  else
    members_[at->second].second = std::move(value);
}

json ordered_object_builder::take() {
  json object = json::object();
  move_members(members_, object);
  members_.clear();
  at_.clear();
  return object;
}

}  // namespace ckpt::detail
