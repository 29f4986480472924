// The terminal escaper (issue 11 item 15) and the --rename / --map front ends (items 6, 17).
#include <doctest/doctest.h>

#include <string>

#include "ckpt/error.h"
#include "ckpt/rekey.h"
#include "base/text_escape.h"

using ckpt::display_name;
using ckpt::escape_controls;

TEST_CASE("display_name leaves plain names alone and quotes escaped ones") {
  CHECK(display_name("model.layers.0.weight") == "model.layers.0.weight");
  CHECK(display_name("caf\xc3\xa9.w") == "caf\xc3\xa9.w");  // printable UTF-8 stays
  CHECK(display_name("a\\b") == "a\\b");
  CHECK(display_name("") == "\"\"");
  CHECK(display_name("\"q\"") == "\"\\\"q\\\"\"");
  CHECK(display_name("a\nb") == "\"a\\nb\"");
  CHECK(display_name("a\\\nb") == "\"a\\\\\\nb\"");
  CHECK(display_name(std::string("n\0l", 3)) == "\"n\\x00l\"");
  CHECK(display_name("\x1b[2K\r\t\x7f") == "\"\\x1b[2K\\r\\t\\x7f\"");
  CHECK(display_name("r\xe2\x80\xae" "x") == "\"r\\u202ex\"");       // RLO
  CHECK(display_name("c\xc2\x9b" "1m") == "\"c\\u009b1m\"");        // C1 CSI
  CHECK(display_name("s\xe2\x80\xa8") == "\"s\\u2028\"");           // line separator
  CHECK(display_name("i\xe2\x81\xa6") == "\"i\\u2066\"");           // LRI
  CHECK(display_name("\xef\xbb\xbf" "b") == "\"\\ufeffb\"");        // BOM / ZWNBSP
  CHECK(display_name("bad\xff") == "\"bad\\xff\"");
  CHECK(display_name("wtf\xed\xa0\x80") == "\"wtf\\xed\\xa0\\x80\"");  // a lone surrogate
  CHECK(display_name("over\xc0\xaf") == "\"over\\xc0\\xaf\"");       // overlong '/'
  CHECK(display_name("cut\xe2\x80") == "\"cut\\xe2\\x80\"");
}

TEST_CASE("escape_controls escapes without quoting and keeps backslashes") {
  CHECK(escape_controls("key 'a\\b'") == "key 'a\\b'");
  CHECK(escape_controls("x\ny\x1b") == "x\\ny\\x1b");
}

TEST_CASE("error lines are one escaped line") {
  ckpt::error e(ckpt::errc::corrupt, "key '\x1b[1A\x1b[2Kfake\r\nline'");
  e.with_file("f\n.pt");
  CHECK(e.one_line() == "f\\n.pt: key '\\x1b[1A\\x1b[2Kfake\\r\\nline'");
}

TEST_CASE("--rename specs: RE2, \\= in the pattern, ECMAScript replacements") {
  auto apply = [](const std::string& spec, const std::string& key) {
    return ckpt::apply_op(ckpt::make_rename_op(spec), key);
  };
  CHECK(apply("^(\\w+)\\.(\\d+)\\.=$1_$2.", "layers.0.weight") == "layers_0.weight");
  CHECK(apply("a\\=b=c", "xa=by") == "xcy");
  CHECK(apply("\\.=$$", "a.b.c") == "a$b$c");
  CHECK(apply("b+=[$&]", "abbbc") == "a[bbb]c");
  CHECK(apply("x=a\\1", "x") == "a\\1");
  CHECK(apply("x=$z", "x") == "$z");
  CHECK(apply("x=a=b", "x") == "a=b");
  CHECK(apply(".*=x", std::string(100000, 'a')) == "x");
  CHECK(apply("(a|aa)*c=z", std::string(60, 'a')) == std::string(60, 'a'));
  auto refused = [](const std::string& spec) {
    try {
      ckpt::make_rename_op(spec);
    } catch (const ckpt::error& e) {
      CHECK(e.kind() == ckpt::errc::usage);
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(refused("(a)\\1=x").find("backreferences") != std::string::npos);
  CHECK(refused("(?=a)b=x").find("lookahead") != std::string::npos);
  CHECK(refused("(?<=a)b=x").find("(?<=a)b") != std::string::npos);
  CHECK(refused("(a)=$2").find("$2") != std::string::npos);
  CHECK(refused("a=$`").find("$`") != std::string::npos);
  CHECK(refused("a=$0").find("$&") != std::string::npos);
  CHECK(!refused("=x").empty());
  CHECK(!refused("no-separator").empty());
  CHECK(!refused("(=x").empty());
}

TEST_CASE("key maps: exact replay, version, duplicate keys") {
  auto m = ckpt::mapping_from_json(R"({"ckptool_key_map": 1, "mapping": {"a.w": "b.w", "b.w": "a.w"}})", "m.json");
  auto op = ckpt::make_map_op(m, "m.json", false);
  auto plan = ckpt::plan_rekey({"a.w", "b.w", "a.bias", "flag"}, {op});
  CHECK(plan.mapping[0].second == "b.w");
  CHECK(plan.mapping[1].second == "a.w");
  CHECK(plan.mapping[2].second == "a.bias");
  CHECK(plan.mapping[3].second == "flag");
  CHECK(plan.collisions.empty());

  auto kind_of = [](const std::string& text) {
    try {
      ckpt::mapping_from_json(text, "m.json");
    } catch (const ckpt::error& e) {
      CHECK(std::string(e.what()).find("m.json") != std::string::npos);
      return e.kind();
    }
    return ckpt::errc::check_failed;  // "not refused"
  };
  CHECK(kind_of(R"({"ckptool_key_map": 2, "mapping": {}})") == ckpt::errc::unsupported);
  CHECK(kind_of(R"({"mapping": {}})") == ckpt::errc::unsupported);
  CHECK(kind_of(R"({"ckptool_key_map": 1, "mapping": {"a": "b", "a": "c"}})") == ckpt::errc::usage);
  CHECK(kind_of(R"({"ckptool_key_map": 1, "mapping": {"a": {"x": 1, "x": 2}}})") == ckpt::errc::usage);
  CHECK(kind_of(R"({"ckptool_key_map": 1, "mapping": {"a": 1}})") == ckpt::errc::usage);
  CHECK(kind_of(R"({"ckptool_key_map": 1, "mapping": )") == ckpt::errc::usage);
}

TEST_CASE("plans report keys renamed to the empty string") {
  auto plan = ckpt::plan_rekey({"flag", "bf"}, {ckpt::make_op(ckpt::key_op::strip_prefix, "flag")});
  REQUIRE(plan.emptied.size() == 1);
  CHECK(plan.emptied[0] == "flag");
}
