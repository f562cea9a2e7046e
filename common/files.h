// Durable file writes and content digests, shared by the index and datastore pipelines.
//
// Every file knnserve produces is written to a temporary name in the same directory, fsynced,
// renamed over the final name and the directory fsynced: a crash leaves either the old file or
// the complete new one, never a half-written file that looks whole.
#ifndef KNNSERVE_COMMON_FILES_H_
#define KNNSERVE_COMMON_FILES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace knnserve {

// Incremental SHA-256 (OpenSSL EVP). Thread-compatible.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(const void* data, size_t size);
  // Lower-case hex digest (64 characters). Call once.
  std::string HexDigest();

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

std::string Sha256Hex(absl::string_view data);

// Size and SHA-256 of a file's content, as recorded in manifests.
struct FileDigest {
  int64_t bytes = 0;
  std::string sha256;  // lower-case hex
};

// An exclusive lock on a directory (flock on DIR/.knnserve.lock), held while the object lives:
// two commands writing one datastore would mix their files (the second deleted the first's
// partial keys, the first then published the second's). Released when the process ends,
// however it ends.
class DirectoryLock {
 public:
  // Creates `dir` when missing. FAILED_PRECONDITION naming it when another process holds it.
  static absl::StatusOr<std::unique_ptr<DirectoryLock>> Acquire(const std::string& dir);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

  // Where RemoveDebris looks: the directory alone (an index's), or its immediate
  // subdirectories too (a datastore's: its index/ and sentence_index/).
  enum class DebrisScope { kDirectory, kDirectoryAndSubdirectories };

  // Removes what killed writers left behind (a spill file holds 8 bytes per corpus token, a
  // shard's temporary its whole size): files named as TemporaryPath names them, of a process
  // that no longer runs, in `scope`. Only that suffix is ours; a writer still running on this
  // machine keeps its files (a writer on another machine sharing the volume is not seen).
  // Returns how many were removed.
  int RemoveDebris(DebrisScope scope) const;

  // Releases `lock` and removes its directory when nothing but the lock file is in it: a
  // command that created the directory and then failed leaves none behind. A directory that
  // holds anything else is kept, the lock file with it.
  static void ReleaseAndRemoveIfEmpty(std::unique_ptr<DirectoryLock> lock);

 private:
  DirectoryLock(std::string dir, int fd) : dir_(std::move(dir)), fd_(fd) {}
  const std::string dir_;
  const int fd_;
};

// "<path>.knnserve-tmp.<pid of this process>": where this process writes `path` before it
// publishes it (renames it to `path`). The suffix tells these files from anyone else's.
std::string TemporaryPath(absl::string_view path);

// Writes a file atomically: Append() goes to TemporaryPath(path), Commit() fsyncs it, renames it
// to `path` and fsyncs the directory. Destroying an uncommitted writer removes the temporary
// file. A `path` that exists and is not a regular file (a device such as /dev/null or /dev/full,
// a FIFO) is written in place instead: renaming over it would replace it with a file. A
// directory is refused. Thread-compatible.
class AtomicFileWriter {
 public:
  static absl::StatusOr<std::unique_ptr<AtomicFileWriter>> Create(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  absl::Status Append(const void* data, size_t size);
  absl::Status Append(absl::string_view data) { return Append(data.data(), data.size()); }
  // Returns the digest of everything appended. No Append() after Commit().
  absl::StatusOr<FileDigest> Commit();

 private:
  AtomicFileWriter(std::string path, std::string temp_path, int fd);

  const std::string path_;
  const std::string temp_path_;  // empty when writing in place
  int fd_;
  bool committed_ = false;
  int64_t bytes_ = 0;
  Sha256 sha_;
};

// One-shot atomic write of `data` to `path`.
absl::StatusOr<FileDigest> WriteFileAtomically(const std::string& path, absl::string_view data);

// For outputs written by libraries that own their file handles (HDF5): build the file under a
// temporary name, then PublishFile() it like AtomicFileWriter::Commit() does.
// "<path>.partial": where such an output is built (and resumed) before it is published.
std::string PartialPath(const std::string& path);
// fsync(temp_path), rename it to final_path, fsync final_path's directory.
absl::Status PublishFile(const std::string& temp_path, const std::string& final_path);

// RESOURCE_EXHAUSTED naming `path` when a file of `final_bytes` cannot be written there: more
// than its file system has free (counting what `path` already holds) or than the process's file
// size limit (RLIMIT_FSIZE). Lets a long step fail before its work, with a clear message, rather
// than on a full disk midway.
absl::Status CheckRoomFor(const std::string& path, int64_t final_bytes);

// A file a command reads or writes, named by the flag that gave it.
struct NamedPath {
  absl::string_view flag;
  std::string path;  // empty or "-" (stdin, stdout): none
};
// INVALID_ARGUMENT naming both flags when two of `paths` name the same file (the same path
// after resolving links and "..", or two names of one existing file): a command would then
// overwrite what it reads, or publish one output over another.
absl::Status CheckDistinctFiles(absl::Span<const NamedPath> paths);

// Size and SHA-256 of a file, streamed in 4 MiB blocks (files too large to read whole).
absl::StatusOr<FileDigest> DigestFile(const std::string& path);
// DATA_LOSS naming the file unless its size and SHA-256 equal `expected`.
absl::Status VerifyFile(const std::string& path, const FileDigest& expected);

// Reads a whole file.
absl::StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path);

// Input read front to back that knows how many bytes are left: a file (VerifiedFileReader) or
// bytes in memory (SpanReader). Parsers of large files take one, so that what they parse goes
// straight into its final form instead of first into a copy of the whole file.
class ByteReader {
 public:
  virtual ~ByteReader() = default;
  // Reads min(size, remaining()) bytes into `data`; returns how many. Errors name the input.
  virtual absl::StatusOr<size_t> Read(void* data, size_t size) = 0;
  virtual uint64_t remaining() const = 0;
  // The input in messages (a file's path).
  virtual const std::string& name() const = 0;
};

// Bytes borrowed from memory; they and `name` must outlive the reader. Thread-compatible.
class SpanReader : public ByteReader {
 public:
  SpanReader(const void* data, size_t size, std::string name)
      : data_(static_cast<const uint8_t*>(data)), size_(size), name_(std::move(name)) {}
  absl::StatusOr<size_t> Read(void* data, size_t size) override;
  uint64_t remaining() const override { return size_ - position_; }
  const std::string& name() const override { return name_; }

 private:
  const uint8_t* const data_;
  const size_t size_;
  const std::string name_;
  size_t position_ = 0;
};

// A file whose size and SHA-256 were checked against `expected` before its first byte is handed
// out (streamed in 4 MiB blocks, so no copy of the file is held), then read through the same
// descriptor with a 1 MiB buffer. Parsers never see a corrupted file: a damaged length field
// could otherwise make them allocate far beyond the file before failing. Being read through the
// descriptor that was checked, a file renamed over `path` meanwhile (how knnserve replaces
// files) is not what gets read; a file rewritten in place is not guarded against. The file is
// read twice, the second time mostly from the page cache. Thread-compatible.
class VerifiedFileReader : public ByteReader {
 public:
  // NOT_FOUND / errno errors naming `path`; DATA_LOSS naming it when size or digest differ.
  static absl::StatusOr<std::unique_ptr<VerifiedFileReader>> Open(const std::string& path,
                                                                  const FileDigest& expected);
  ~VerifiedFileReader() override;
  VerifiedFileReader(const VerifiedFileReader&) = delete;
  VerifiedFileReader& operator=(const VerifiedFileReader&) = delete;

  absl::StatusOr<size_t> Read(void* data, size_t size) override;
  uint64_t remaining() const override { return remaining_; }
  const std::string& name() const override { return path_; }

 private:
  VerifiedFileReader(std::string path, int fd, uint64_t size);

  const std::string path_;
  const int fd_;
  uint64_t remaining_;  // bytes not yet handed out
  std::vector<uint8_t> buffer_;
  size_t buffer_begin_ = 0;  // buffer_[buffer_begin_, buffer_end_) read but not handed out
  size_t buffer_end_ = 0;
};

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_FILES_H_
