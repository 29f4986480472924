// Test helper: copies every record of zip archive IN into a new archive OUT through
// ckpt::zip::archive and ckpt::zip::writer, in central-directory order.
//   zip_copy [--prefix P] [--alignment N] [--compute-crc] [--verify] IN OUT
// Stored records go through add_record_copy with the source's CRC (copy_file_range) unless
// --compute-crc; deflated records are inflated and stored. --verify checks each source CRC
// first. Exit status: 0, or the ckptool exit code of the error kind.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ckpt/byte_source.h"
#include "ckpt/error.h"
#include "ckpt/zip_reader.h"
#include "ckpt/zip_writer.h"

int main(int argc, char** argv) {
  std::string prefix, in, out;
  uint64_t alignment = 64;
  bool compute_crc = false, verify = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--prefix" && i + 1 < argc) prefix = argv[++i];
    else if (a == "--alignment" && i + 1 < argc) alignment = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--compute-crc") compute_crc = true;
    else if (a == "--verify") verify = true;
    else if (in.empty()) in = a;
    else out = a;
  }
  if (in.empty() || out.empty()) {
    std::fprintf(stderr, "usage: zip_copy [--prefix P] [--alignment N] [--compute-crc] [--verify] IN OUT\n");
    return 2;
  }
  try {
    ckpt::file_source src(in);
    auto archive = ckpt::zip::archive::open(src);
    int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw ckpt::error(ckpt::errc::io, std::string("cannot create: ") + std::strerror(errno));
    ckpt::zip::writer w(fd, prefix.empty() ? archive->prefix() : prefix, alignment);
    for (const auto& e : archive->entries()) {
      if (verify) archive->verify_crc(e);
      if (e.method == 0) {
        std::optional<uint32_t> crc;
        if (!compute_crc) crc = e.crc32;
        w.add_record_copy(e.record, src.fd(), e.data_offset, e.compressed_size, crc);
      } else {
        w.add_record(e.record, archive->read_record(e));
      }
    }
    w.finish();
    if (::close(fd) != 0) throw ckpt::error(ckpt::errc::io, std::string("close: ") + std::strerror(errno));
    return 0;
  } catch (const ckpt::error& e) {
    std::fprintf(stderr, "zip_copy: %s\n", e.what());
    return ckpt::exit_code(e.kind());
  }
}
