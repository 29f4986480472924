// What an embedding service writes to run one program of a torch.export archive through the
// library (ckpt/materialize.h, formats.md §14.9), compiled by the test suite and run by
// tests/py/test_pt2_run_program.py:
//
//   run_pt2_program ARCHIVE PROGRAM SHAPE...
//
// runs forward of PROGRAM ("" for the archive's only program) on float inputs of the given
// shapes (4x5), made as ckptool's --run makes them. Prints the program run and one line per
// output (path, shape, sum); a ckpt::error exits with its documented code, its kind and
// message on stderr.
#include <iomanip>
#include <iostream>

#include "ckpt/checkpoint.h"
#include "ckpt/error.h"
#include "ckpt/materialize.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: run_pt2_program ARCHIVE PROGRAM SHAPE...\n";
    return 2;
  }
  try {
    ckpt::materialize_request req;
    req.model = argv[1];
    req.program = argv[2];
    req.run_method = "forward";
    for (int i = 3; i < argc; ++i) {
      ckpt::input_spec in;
      std::string s = argv[i];
      for (size_t at = 0; at <= s.size();) {
        const size_t x = std::min(s.find('x', at), s.size());
        in.shape.push_back(std::stoll(s.substr(at, x - at)));
        at = x + 1;
      }
      req.run_inputs.push_back(in);
    }
    ckpt::checkpoint unused;  // the archive is already filled: only the run is asked for
    const ckpt::materialize_report r = ckpt::materialize(unused, req);
    std::cout << "program " << r.run_program << "\n";
    for (size_t i = 0; i < r.outputs.size(); ++i) {
      std::cout << "output " << (r.outputs[i].path.empty() ? "-" : r.outputs[i].path);
      for (int64_t d : r.outputs[i].shape) std::cout << " " << d;
      std::cout << " sum " << std::setprecision(17) << r.checksums[i] << "\n";
    }
  } catch (const ckpt::error& e) {
    std::cerr << ckpt::errc_name(e.kind()) << ": " << e.what() << "\n";
    return ckpt::exit_code(e.kind());
  }
  return 0;
}
