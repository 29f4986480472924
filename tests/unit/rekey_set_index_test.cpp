// ckpt::renamed_index_text: the index a renamed shard set gets is the text its writer
// would have written (formats.md §11.2); each case pairs a writer's style with its twin.
#include <doctest/doctest.h>

#include <string>

#include "ckpt/error.h"
#include "ckpt/rekey_set.h"

namespace {

std::string strip(const std::string& k) { return k.rfind("_orig_mod.", 0) == 0 ? k.substr(10) : k; }
std::string add(const std::string& k) { return "z." + k; }

}  // namespace

TEST_CASE("transformers' index: sorted keys, indent 2, final newline; sorted again after renaming") {
  const std::string in =
      "{\n  \"metadata\": {\n    \"total_parameters\": 6,\n    \"total_size\": 24\n  },\n"
      "  \"weight_map\": {\n    \"a\": \"model-00002-of-00002.safetensors\",\n"
      "    \"b\": \"model-00001-of-00002.safetensors\"\n  }\n}\n";
  CHECK(ckpt::renamed_index_text(in, [](const std::string& k) { return k; }) == in);
  const std::string renamed = ckpt::renamed_index_text(in, [](const std::string& k) { return k == "a" ? "c" : k; });
  CHECK(renamed ==
        "{\n  \"metadata\": {\n    \"total_parameters\": 6,\n    \"total_size\": 24\n  },\n"
        "  \"weight_map\": {\n    \"b\": \"model-00001-of-00002.safetensors\",\n"
        "    \"c\": \"model-00002-of-00002.safetensors\"\n  }\n}\n");
}

TEST_CASE("huggingface_hub's index: its own order, no final newline, even when sorted by chance") {
  const std::string in =
      "{\n  \"metadata\": {\n    \"total_size\": 24\n  },\n  \"weight_map\": {\n"
      "    \"_orig_mod.a\": \"model-00001-of-00002.safetensors\",\n"
      "    \"_orig_mod.b\": \"model-00002-of-00002.safetensors\"\n  }\n}";
  const std::string out = ckpt::renamed_index_text(in, add);
  CHECK(out ==
        "{\n  \"metadata\": {\n    \"total_size\": 24\n  },\n  \"weight_map\": {\n"
        "    \"z._orig_mod.a\": \"model-00001-of-00002.safetensors\",\n"
        "    \"z._orig_mod.b\": \"model-00002-of-00002.safetensors\"\n  }\n}");
  // Unsorted order kept: b before a stays b before a.
  const std::string unsorted =
      "{\n  \"weight_map\": {\n    \"_orig_mod.b\": \"x.bin\",\n    \"_orig_mod.a\": \"y.bin\"\n  },\n"
      "  \"metadata\": {\"total_size\": 1, \"user\": [1.5, null, \"\xc3\xa9\"]}\n}\n";
  const std::string stripped = ckpt::renamed_index_text(unsorted, strip);
  CHECK(stripped ==
        "{\n  \"weight_map\": {\n    \"b\": \"x.bin\",\n    \"a\": \"y.bin\"\n  },\n"
        "  \"metadata\": {\n    \"total_size\": 1,\n    \"user\": [\n      1.5,\n      null,\n      \"\\u00e9\"\n"
        "    ]\n  }\n}\n");
}

TEST_CASE("an index that is not JSON is corrupt") {
  CHECK_THROWS_AS(ckpt::renamed_index_text("{\"weight_map\": ", strip), ckpt::error);
}
