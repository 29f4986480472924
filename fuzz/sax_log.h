#pragma once
// A JSON SAX handler that writes each event as a line and refuses nothing: the quick JSON
// reader (base/json_subset_sax.h) and nlohmann's parser must write the same log for any
// text the quick reader takes. Shared by the hf_index fuzz target and its unit test.
#include <string>

#include <nlohmann/json.hpp>

namespace ckpt::fuzz {

struct sax_log : nlohmann::json_sax<nlohmann::json> {
  std::string log;
  bool null() override { return add("null"); }
  bool boolean(bool b) override { return add(b ? "true" : "false"); }
  bool number_integer(number_integer_t v) override { return add("int " + std::to_string(v)); }
  bool number_unsigned(number_unsigned_t v) override { return add("uint " + std::to_string(v)); }
  bool number_float(number_float_t, const string_t& s) override { return add("float " + s); }
  bool string(string_t& s) override { return add("str " + s); }
  bool binary(binary_t&) override { return add("binary"); }
  bool start_object(std::size_t) override { return add("{"); }
  bool key(string_t& k) override { return add("key " + k); }
  bool end_object() override { return add("}"); }
  bool start_array(std::size_t) override { return add("["); }
  bool end_array() override { return add("]"); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
  bool add(const std::string& s) {
    log += s;
    log += '\n';
    return true;
  }
};

}  // namespace ckpt::fuzz
