// Opens bytes [OFFSET, OFFSET+LENGTH) of FILE as a checkpoint through ckpt::slice_source,
// as the DCP reader will open a chunk's torch.save archive inside a .distcp file, and
// prints its format and one line per tensor ("tensor PATH DTYPE DIM..."; a DCP chunk is
// one tensor saved alone, at the root, whose PATH is empty). On an error, prints
// its one line to stderr and exits with the documented code.
//
//   slice_inspect FILE OFFSET LENGTH
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include "ckpt/checkpoint.h"
#include "ckpt/error.h"
#include "io/slice_source.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: slice_inspect FILE OFFSET LENGTH\n";
    return 2;
  }
  try {
    auto parent = std::make_shared<ckpt::file_source>(argv[1]);
    auto slice = std::make_unique<ckpt::slice_source>(parent, std::stoull(argv[2]), std::stoull(argv[3]));
    const ckpt::checkpoint c = ckpt::open_checkpoint(std::move(slice));
    std::cout << "path " << c.path << "\nformat " << ckpt::format_name(c.format) << "\n";
    for (const ckpt::tensor_record& t : c.tensors) {
      std::cout << "tensor " << ckpt::path_to_string(t.path) << " " << ckpt::name(t.type);
      for (int64_t d : t.shape) std::cout << " " << d;
      std::cout << "\n";
    }
  } catch (const ckpt::error& e) {
    std::cerr << "slice_inspect: " << ckpt::errc_name(e.kind()) << ": " << e.one_line() << "\n";
    return ckpt::exit_code(e.kind());
  }
  return 0;
}
