// inspect, verify and materialize --model for AOTInductor packages (ckpt/aoti.h,
// docs/formats.md §15). A hook each verb calls before its generic open: an AOTI package
// is a pt2 archive with data/aotinductor/<model>/ and no models/*.json.
#pragma once

#include <memory>
#include <string>

#include "ckpt/aoti.h"
#include "ckpt/byte_source.h"
#include "ckpt/zip_reader.h"

namespace cli {

struct aoti_opened {
  std::unique_ptr<ckpt::file_source> source;
  std::unique_ptr<ckpt::zip::archive> archive;
  ckpt::aoti::package package;
};

/// True when `path` is a regular file holding an AOTInductor package; any failure to
/// open or parse it as a zip is false (the generic open then reports it).
bool is_aoti_package_file(const std::string& path);

/// True when `path` is a regular zip file whose `archive_format` record says `pt2` (a
/// torch.export archive or an AOTInductor package); false on any failure, as above.
bool is_pt2_archive_file(const std::string& path);

/// The package read from metadata (errors name the file).
aoti_opened open_aoti_package(const std::string& path);

int inspect_aoti(const std::string& path, bool json, bool pretty);
int verify_aoti(const std::string& path, bool json);

}  // namespace cli
