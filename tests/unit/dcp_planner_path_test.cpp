// ckpt::dcp::rename_path as a pure function: the planner_data paths flatten_state_dict makes
// (docs/formats.md §9.7), each rename that fits them exactly, and each that does not.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "rekey/dcp_planner_path.h"

namespace dcp = ckpt::dcp;

namespace {

dcp::path_element key(std::string k) {
  dcp::path_element e;
  e.key = std::move(k);
  return e;
}
dcp::path_element index(int64_t i) {
  dcp::path_element e;
  e.is_index = true;
  e.index = i;
  return e;
}

// The renamed path as Python prints it, or "refused: WHY".
std::string renamed(const std::vector<dcp::path_element>& path, const std::string& new_key) {
  std::string why;
  auto p = dcp::rename_path(path, new_key, &why);
  return p ? dcp::repr_path(*p) : "refused: " + why;
}

}  // namespace

TEST_CASE("planner_data paths: one mapping key renamed or removed") {
  CHECK(dcp::join_path({key("optim"), key("param_groups"), index(0), key("lr")}) == "optim.param_groups.0.lr");
  // A key with dots in it is one element: the edit stays inside it.
  CHECK(renamed({key("model"), key("_orig_mod.0.weight")}, "model.0.weight") == "('model', '0.weight')");
  CHECK(renamed({key("_orig_mod.w")}, "w") == "('w',)");
  CHECK(renamed({key("optim"), key("state"), key("_orig_mod.2.bias"), key("exp_avg")}, "optim.state.2.bias.exp_avg") ==
        "('optim', 'state', '2.bias', 'exp_avg')");
  CHECK(renamed({key("layers"), index(1), key("_orig_mod.w")}, "layers.1.w") == "('layers', 1, 'w')");
  // A level of its own goes.
  CHECK(renamed({key("model"), key("_orig_mod"), key("dec.w")}, "model.dec.w") == "('model', 'dec.w')");
  // strip-prefix of a whole level.
  CHECK(renamed({key("model"), key("x.w")}, "x.w") == "('x.w',)");
  CHECK(renamed({key("model"), key("x.w")}, "net.x.w") == "('net', 'x.w')");
}

TEST_CASE("planner_data paths: edits that no single level carries are refused") {
  // Across two levels.
  CHECK(renamed({key("model"), key("_orig_mod"), key("enc.w")}, "m.enc.w").find("more than one level") !=
        std::string::npos);
  // A list index is a position, never renamed.
  CHECK(renamed({key("layers"), index(0), key("w")}, "layers.1.w").rfind("refused", 0) == 0);
  // Two different paths fit: refused, not guessed.
  CHECK(renamed({key("x"), key("y")}, "x.x.y").find("2 ways") != std::string::npos);
  // Removing one of two equal levels is one answer, not two.
  CHECK(renamed({key("a"), key("a"), key("w")}, "a.w") == "('a', 'w')");
}
