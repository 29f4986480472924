// Internal: the zip record layout constants the reader and the writer share (APPNOTE
// 6.3.x; formats.md §2.1). One definition, so the two cannot drift apart.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ckpt::zip::format {

constexpr uint32_t kLocalSig = 0x04034b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kEndSig = 0x06054b50;
constexpr uint32_t kZip64EndSig = 0x06064b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr uint32_t kDescriptorSig = 0x08074b50;

constexpr size_t kLocalHeaderSize = 30;
constexpr size_t kCentralHeaderSize = 46;
constexpr size_t kEndSize = 22;
constexpr size_t kZip64EndSize = 56;  // fixed part, up to and including the cd offset
constexpr size_t kZip64LocatorSize = 20;

// A 16- or 32-bit field holding this says "the value is in the ZIP64 record or extra field".
constexpr uint16_t kSentinel16 = 0xFFFF;
constexpr uint32_t kSentinel32 = 0xFFFFFFFF;

constexpr uint16_t kZip64ExtraId = 0x0001;
constexpr uint16_t kFlagDescriptor = 0x0008;
constexpr uint16_t kFlagUtf8 = 0x0800;

}  // namespace ckpt::zip::format
