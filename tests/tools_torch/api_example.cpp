// The C++ API example of README.md, compiled by the test suite and run by
// tests/py/test_materialize.py:
//
//   api_example MODEL CKPT DEVICE [FEATURES]
//
// loads every tensor of CKPT onto DEVICE, then builds the TorchScript MODEL with its weights
// filled from CKPT (never randomly initialized) and, given FEATURES, runs forward on a
// 2 x FEATURES batch of ones. Exit 0, or 1 with the error on stderr.
#include <iomanip>
#include <iostream>

#include "ckpt/load.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: api_example MODEL CKPT DEVICE [FEATURES]\n";
    return 2;
  }
  try {
    ckpt::load_options options;
    options.device = c10::Device(argv[3]);  // "cpu", "cuda", "cuda:1", ...

    // Every tensor of the checkpoint, straight from the file onto the device.
    std::vector<std::pair<std::string, at::Tensor>> tensors = ckpt::load_tensors(argv[2], options);
    std::cout << "tensors: " << tensors.size() << "\n";

    // The model's skeleton built on meta, each parameter and buffer filled from the
    // checkpoint (wrapper prefixes such as Lightning's model._orig_mod. are solved for).
    ckpt::module_load_report report;
    torch::jit::Module model = ckpt::load_module(argv[1], argv[2], options, /*strict=*/true, &report);
    model.eval();
    std::cout << "key edit: " << report.key_edit << "\n";

    if (argc > 4) {
      torch::NoGradGuard no_grad;
      at::Tensor x = at::ones({2, std::stoll(argv[4])}, at::TensorOptions().device(options.device));
      at::Tensor y = model.forward({x}).toTensor();
      std::cout << "forward: " << y.sizes() << " sum " << std::setprecision(17) << y.sum().item<double>() << "\n";
    }
  } catch (const std::exception& e) {  // ckpt::error (ckpt/error.h) or c10::Error
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
