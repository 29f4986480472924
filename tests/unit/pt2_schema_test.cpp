// The JSON readers of torch.export archives (src/formats/pt2_program.cpp, pt2_schema.cpp):
// the srepr and TreeSpec renderers, and what the config and program readers refuse.
#include <doctest/doctest.h>

#include <memory>

#include "ckpt/error.h"
#include "formats/pt2_program.h"
#include "report/pt2_report.h"

using namespace ckpt;
using namespace ckpt::detail;

namespace {

const pt2s::where kWhere{"data/weights/model_weights_config.json", 100};

std::string config_with(const std::string& meta) {
  return R"({"config": {"fc.weight": {"path_name": "weight_0", "is_param": true, "use_pickle": false,
    "tensor_meta": )" + meta + "}}}";
}

std::string meta(const std::string& dtype, const std::string& offset = R"({"as_int": 0})") {
  return R"({"dtype": )" + dtype + R"(, "sizes": [{"as_int": 3}, {"as_int": 4}], "requires_grad": true,
    "device": {"type": "cpu", "index": null}, "strides": [{"as_int": 4}, {"as_int": 1}],
    "storage_offset": )" + offset + R"(, "layout": 7})";
}

std::string failure(const std::string& text) {
  try {
    parse_payload_config(text, kWhere);
  } catch (const error& e) {
    CHECK(e.offset() == 100);
    return e.message();
  }
  return "";
}

}  // namespace

TEST_CASE("pt2: srepr renders the forms sympy prints") {
  CHECK(pt2s::render_srepr("Symbol('s77', positive=True, integer=True)") == "s77");
  CHECK(pt2s::render_srepr("Mul(Integer(2), Symbol('s77', positive=True, integer=True))") == "2*s77");
  CHECK(pt2s::render_srepr("Add(Symbol('s17', positive=True, integer=True), Integer(-1))") == "s17 - 1");
  CHECK(pt2s::render_srepr("Add(Integer(-1), Symbol('s17'))") == "s17 - 1");
  CHECK(pt2s::render_srepr("Add(Symbol('s0'), Mul(Integer(-1), Symbol('s1')))") == "s0 - s1");
  CHECK(pt2s::render_srepr("Mul(Integer(3), Add(Symbol('s0'), Integer(1)))") == "3*(s0 + 1)");
  CHECK(pt2s::render_srepr("FloorDiv(Symbol('s0'), Integer(2))") == "s0//2");
  CHECK(pt2s::render_srepr("Mod(Add(Symbol('s0'), Integer(1)), Integer(8))") == "(s0 + 1) % 8");
  CHECK(pt2s::render_srepr("Max(Integer(1), Symbol('s0'))") == "Max(1, s0)");
  CHECK(pt2s::render_srepr("Pow(Symbol('s0'), Integer(2))") == "s0**2");
  CHECK(pt2s::render_srepr("Integer(7)") == "7");
  // Anything else: declined (the caller shows the raw text and the hint).
  CHECK_FALSE(pt2s::render_srepr("Rational(1, 2)"));
  CHECK_FALSE(pt2s::render_srepr("Symbol('s0'"));
  CHECK_FALSE(pt2s::render_srepr("Symbol('s0; rm -rf')"));
  CHECK_FALSE(pt2s::render_srepr(std::string(100, '(')));
  std::string deep;
  for (int i = 0; i < 200; ++i) deep += "Max(Integer(1), ";
  deep += "Integer(2)";
  for (int i = 0; i < 200; ++i) deep += ")";
  CHECK_FALSE(pt2s::render_srepr(deep));
}

TEST_CASE("pt2: TreeSpec rendering names the leaves") {
  const std::string in =
      R"([1, {"type": "builtins.tuple", "context": "null", "children_spec": [{"type": "builtins.tuple", "context": "null", "children_spec": [{"type": null, "context": null, "children_spec": []}, {"type": null, "context": null, "children_spec": []}]}, {"type": "builtins.dict", "context": "[]", "children_spec": []}]}])";
  CHECK(render_treespec(in, {"idx", "x"}) == "((idx, x), {})");
  const std::string out =
      R"([1, {"type": "builtins.tuple", "context": "null", "children_spec": [{"type": null, "context": null, "children_spec": []}, {"type": "builtins.dict", "context": "[\"logits\"]", "children_spec": [{"type": null, "context": null, "children_spec": []}]}]}])";
  CHECK(render_treespec(out, {"a"}) == "(a, {'logits': *})");
  CHECK_FALSE(render_treespec("[2, {}]", {}));
  CHECK_FALSE(render_treespec("not json", {}));
}

TEST_CASE("pt2: payload config entries and what is refused") {
  auto entries = parse_payload_config(config_with(meta("7")), kWhere);
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].fqn == "fc.weight");
  CHECK(entries[0].meta->type == dtype::float32);
  CHECK(entries[0].meta->sizes[1].value == 4);
  CHECK(parse_payload_config(config_with(meta("13")), kWhere)[0].meta->type == dtype::bfloat16);
  CHECK(parse_payload_config(config_with(meta("28")), kWhere)[0].meta->type == dtype::uint16);

  CHECK(failure(config_with(meta("99"))).find("dtype 99") != std::string::npos);
  CHECK(failure(config_with(meta("0"))).find("dtype 0") != std::string::npos);
  CHECK(failure(config_with(meta("7", R"({"as_bogus": 0})"))).find("as_bogus") != std::string::npos);
  CHECK(failure(config_with(meta("7", R"({"as_int": 0, "as_expr": 1})"))).find("one member") != std::string::npos);
  CHECK(failure(config_with(meta("7", R"({"as_int": 1e3})"))).find("integer") != std::string::npos);
  CHECK(failure(R"({"config": {"w": {"path_name": "../x", "is_param": true, "use_pickle": false}}})")
            .find("plain file name") != std::string::npos);
  CHECK(failure("[1, 2").find("not valid JSON") != std::string::npos);
  CHECK(failure(std::string(300, '[') + std::string(300, ']')).find("nested deeper") != std::string::npos);
  CHECK(failure(R"({"nothing": 1})").find("'config'") != std::string::npos);
  // Each message names the record and the entry.
  CHECK(failure(config_with(meta("99"))).find("data/weights/model_weights_config.json: entry 'fc.weight'") == 0);
}

TEST_CASE("pt2: program union tags are checked") {
  const std::string head = R"({"schema_version": {"major": 8, "minor": 17}, "graph_module": {"graph": {"inputs": [], "outputs": [],
      "nodes": [], "tensor_values": {"x": )" + meta("7") + R"(}}, "signature": {"input_specs": [)";
  const std::string tail = R"(], "output_specs": []}, "module_call_graph": []}})";
  pt2::program p = parse_program(head + R"({"user_input": {"arg": {"as_tensor": {"name": "x"}}}})" + tail, kWhere);
  REQUIRE(p.inputs.size() == 1);
  CHECK(p.inputs[0].role == "user_input");
  CHECK(p.inputs[0].arg.dtype == "float32");
  CHECK_THROWS_WITH_AS(parse_program(head + R"({"user_inpt": {"arg": {"as_tensor": {"name": "x"}}}})" + tail, kWhere),
                       doctest::Contains("unknown InputSpec variant 'user_inpt'"), error);
  CHECK_THROWS_WITH_AS(parse_program(head + R"({"user_input": {"arg": {"as_tensr": {"name": "x"}}}})" + tail, kWhere),
                       doctest::Contains("unknown Argument variant 'as_tensr'"), error);
}

TEST_CASE("pt2: a program read without its graph has the same signature names, no node, no value metadata, and says so") {
  const std::string text = R"({"schema_version": {"major": 8, "minor": 17}, "graph_module": {"graph": {"inputs": [],
      "outputs": [], "nodes": [{"target": "torch.ops.aten.relu.default", "name": "relu", "inputs": [],
      "outputs": [{"as_tensor": {"name": "x"}}], "metadata": {}}], "tensor_values": {"x": )" + meta("7") +
                           R"(}}, "signature": {"input_specs": [{"user_input": {"arg": {"as_tensor": {"name": "x"}}}}],
      "output_specs": []}, "module_call_graph": []}})";
  const pt2::program full = parse_program(text, kWhere);
  const pt2::program light = parse_program(text, kWhere, false);
  CHECK(full.graph_read);
  CHECK(full.nodes.size() == 1);
  CHECK_FALSE(light.graph_read);
  CHECK(light.nodes.empty());
  REQUIRE(light.inputs.size() == 1);
  CHECK(light.inputs[0].role == full.inputs[0].role);
  CHECK(light.inputs[0].arg.name == full.inputs[0].arg.name);
  CHECK(full.inputs[0].arg.has_meta);
  CHECK(full.inputs[0].arg.dtype == "float32");
  CHECK_FALSE(light.inputs[0].arg.has_meta);
  CHECK(light.inputs[0].arg.dtype.empty());
  // Metadata the full reader refuses is not read either; it is still JSON.
  std::string bad_meta = text;
  bad_meta.replace(bad_meta.find("\"tensor_values\": {\"x\": "), 22, "\"tensor_values\": {\"x\": 5, \"y\": ");
  CHECK_THROWS_AS(parse_program(bad_meta, kWhere), error);
  CHECK(parse_program(bad_meta, kWhere, false).inputs.size() == 1);
  // A node the full reader refuses is not read at all; text that is not JSON still is.
  std::string unknown = text;
  const std::string node_output = R"("outputs": [{"as_tensor": {"name": "x"}}], "metadata")";
  unknown.replace(unknown.find(node_output), node_output.size(), R"("outputs": [{"as_bogus": 1}], "metadata")");
  CHECK_THROWS_WITH_AS(parse_program(unknown, kWhere), doctest::Contains("as_bogus"), error);
  CHECK(parse_program(unknown, kWhere, false).inputs.size() == 1);
  std::string broken = text;
  broken.replace(broken.find("\"nodes\": ["), 10, "\"nodes\": [,");
  CHECK_THROWS_WITH_AS(parse_program(broken, kWhere, false), doctest::Contains("not valid JSON"), error);

  // The report: a count of nodes only where they were read.
  auto archive = std::make_shared<pt2::archive_info>();
  archive->models.resize(2);
  archive->models[0].prog = full;
  archive->models[1].prog = light;
  checkpoint c;
  c.pt2 = archive;
  const nlohmann::json j = pt2_inspect_json(c, false);
  CHECK(j["models"][0]["nodes"] == 1);
  CHECK(j["models"][1]["nodes"].is_null());
}
