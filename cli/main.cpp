// ckptool: wiring only. Each verb lives in cmd_<verb>.cpp; errors are caught here, printed
// as one line, and mapped to the documented exit codes (man/ckptool.1).
#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <new>

#include "ckpt/error.h"
#include "base/text_escape.h"
#include "cmd_diff.h"
#include "cmd_convert.h"
#include "cmd_inspect.h"
#include "cmd_materialize.h"
#include "cmd_rekey.h"
#include "cmd_verify.h"
#include "common.h"
#include "distributed.h"
#include "signals.h"

namespace {

// "ckptool: usage: MESSAGE (see 'ckptool VERB --help')": the documented one-line error form,
// for CLI11's parse errors too (its own format spans two lines).
void print_usage_error(const CLI::App& app, const std::string& message) {
  std::string verb;
  for (const CLI::App* sub : app.get_subcommands()) verb = sub->get_name() + " ";
  std::string line = message;
  for (char& c : line)
    if (c == '\n') c = ' ';
  std::cerr << "ckptool: usage: " << ckpt::escape_controls(line) << " (see 'ckptool " << verb << "--help')\n";
}

int run(int argc, char** argv) {
  cli::install_signal_handlers();
  auto logger = spdlog::stderr_color_mt("ckptool");
  logger->set_pattern("ckptool: %l: %v");
  spdlog::set_default_logger(logger);

  CLI::App app{"ckptool: inspect, rekey and materialize PyTorch checkpoints without unpickling them"};
  app.set_version_flag("--version", std::string("ckptool ") + CKPTOOL_VERSION);
  app.require_subcommand(1);
  app.fallthrough(false);
  const cli::verb verbs[] = {cli::setup_inspect(app), cli::setup_rekey(app), cli::setup_materialize(app),
                             cli::setup_verify(app), cli::setup_diff(app), cli::setup_convert(app)};

  int status = 0;
  try {
    app.parse(argc, argv);
    for (const cli::verb& v : verbs)
      if (v.command->parsed()) status = v.run();
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    print_usage_error(app, e.what());
    return ckpt::exit_code(ckpt::errc::usage);
  } catch (const ckpt::error& e) {
    std::cerr << "ckptool: " << ckpt::errc_name(e.kind()) << ": " << e.one_line() << "\n";
    return ckpt::exit_code(e.kind());
  } catch (const std::bad_alloc&) {
    throw;  // main() reports it without allocating
  } catch (const std::exception& e) {
    std::string what = e.what();
    for (char& c : what)
      if (c == '\n') c = ' ';
    std::cerr << "ckptool: internal error: " << ckpt::escape_controls(what) << "\n";
    return ckpt::exit_code(ckpt::errc::corrupt);
  }
  // A report that did not reach its reader is a failed command, not a silent exit 0.
  if (!cli::flush_stdout()) {
    std::cerr << "ckptool: io: cannot write to standard output\n";
    return ckpt::exit_code(ckpt::errc::io);
  }
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  // Out of memory anywhere, even while the command line is being set up (ulimit -v): one
  // line, exit 4, and nothing allocated to say so.
  try {
    const int status = run(argc, argv);
    if (cli::joined_a_group()) {
      // A rank of a parallel command: everything is committed and reported, and the group
      // is closed. What is left is LibTorch's teardown, which only costs time.
      spdlog::shutdown();
      std::fflush(nullptr);
      std::_Exit(status);
    }
    return status;
  } catch (const std::bad_alloc&) {
    std::fputs("ckptool: io: out of memory\n", stderr);
    return ckpt::exit_code(ckpt::errc::io);
  }
}
