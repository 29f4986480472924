// Test helper: runs ckpt::write_rekeyed_dcp over a DCP directory into a fresh directory it
// creates (the output policy that will wrap it in `ckptool rekey` is not this helper's),
// and prints the result as JSON; tests/py/test_dcp_rekey.py loads the output with dcp.load.
//   dcp_rekey_tool [--dry-run] [--strip-compiled] [--strip-wrappers] [--strip-prefix P]
//                  [--add-prefix P] [--add-compiled PATH] [--rename REGEX=REPL] IN_DIR OUT_DIR
// OUT_DIR must not exist (a dry run creates nothing), unless --existing (then it must be an
// empty directory, as the staging directory the output policy makes). IN_DIR is reached as
// a name below its parent (the opener's root), as a directory named in an index would be.
// Exit status: 0, or the ckptool exit
// code of the error, whose one line goes to stderr.
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/dcp_rekey.h"
#include "ckpt/error.h"

int main(int argc, char** argv) {
  std::vector<ckpt::key_op> ops;
  ckpt::dcp_rekey_options options;
  std::vector<std::string> paths;
  bool existing = false;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) throw ckpt::error(ckpt::errc::usage, a + " needs an argument");
        return argv[++i];
      };
      if (a == "--dry-run") options.dry_run = true;
      else if (a == "--existing") existing = true;
      else if (a == "--strip-compiled") ops.push_back(ckpt::make_op(ckpt::key_op::strip_compiled));
      else if (a == "--strip-wrappers") ops.push_back(ckpt::make_op(ckpt::key_op::strip_wrappers));
      else if (a == "--strip-prefix") ops.push_back(ckpt::make_op(ckpt::key_op::strip_prefix, next()));
      else if (a == "--add-prefix") ops.push_back(ckpt::make_op(ckpt::key_op::add_prefix, next()));
      else if (a == "--add-compiled") ops.push_back(ckpt::make_op(ckpt::key_op::add_compiled, next()));
      else if (a == "--rename") ops.push_back(ckpt::make_rename_op(next()));
      else paths.push_back(a);
    }
    if (paths.size() != 2) throw ckpt::error(ckpt::errc::usage, "usage: dcp_rekey_tool [OPS] IN_DIR OUT_DIR");
    if (!options.dry_run && !existing && ::mkdir(paths[1].c_str(), 0755) != 0)
      throw ckpt::error(ckpt::errc::usage, std::string("cannot create the output directory: ") + std::strerror(errno))
          .with_file(paths[1]);
    std::string dir = paths[0];
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    const size_t slash = dir.rfind('/');
    const std::string parent = slash == std::string::npos ? "" : dir.substr(0, slash + 1);
    const std::string name = slash == std::string::npos ? dir : dir.substr(slash + 1);
    ckpt::disk_opener in(parent);
    ckpt::dcp_rekey_result r = ckpt::write_rekeyed_dcp(in, name, ops, paths[1], options);
    nlohmann::ordered_json out;
    nlohmann::ordered_json mapping = nlohmann::ordered_json::object();
    for (const auto& [from, to] : r.plan.mapping)
      if (from != to) mapping[from] = to;
    out["mapping"] = mapping;
    out["changed"] = r.plan.changed;
    out["unused_ops"] = r.plan.unused_ops;
    out["storage_renamed"] = r.storage_renamed;
    out["planner_renamed"] = r.planner_renamed;
    out["byte_items"] = r.byte_items;
    out["unchecked_byte_items"] = r.unchecked_byte_items;
    out["byte_item_globals"] = r.byte_item_globals;
    out["data_files"] = r.data_files;
    out["other_files"] = r.other_files;
    out["unknown_fields"] = r.unknown_fields;
    out["metadata_bytes"] = r.metadata_bytes;
    out["bytes_copied"] = r.bytes_copied;
    std::cout << out.dump(1) << "\n";
    return 0;
  } catch (ckpt::error& e) {
    std::cerr << e.one_line() << "\n";
    return ckpt::exit_code(e.kind());
  }
}
