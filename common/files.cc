#include "common/files.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/status_macros.h"

namespace knnserve {
namespace {

constexpr absl::string_view kTemporarySuffix = ".knnserve-tmp.";
constexpr char kLockFileName[] = ".knnserve.lock";

// Whether process `pid` exists (EPERM: it does, another user's).
bool ProcessRuns(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  const int err = errno;
  return absl::ErrnoToStatus(err, absl::StrCat(what, " ", path));
}

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// The rename is durable only once the directory entry is on disk too.
absl::Status FsyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return ErrnoError("cannot open directory", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return ErrnoError("cannot fsync directory", dir);
  return absl::OkStatus();
}

// Completes a publication once the temporary file's data is on disk.
absl::Status RenameDurably(const std::string& temp_path, const std::string& final_path) {
  if (::rename(temp_path.c_str(), final_path.c_str()) != 0) {
    return ErrnoError(absl::StrCat("cannot rename ", temp_path, " to"), final_path);
  }
  return FsyncDirectory(DirectoryOf(final_path));
}

}  // namespace

struct Sha256::Ctx {
  EVP_MD_CTX* md = nullptr;
};

Sha256::Sha256() : ctx_(std::make_unique<Ctx>()) {
  ctx_->md = EVP_MD_CTX_new();
  KNNSERVE_CHECK(ctx_->md != nullptr, "EVP_MD_CTX_new failed");
  KNNSERVE_CHECK(EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr) == 1, "sha256 init failed");
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_->md); }

void Sha256::Update(const void* data, size_t size) {
  KNNSERVE_CHECK(EVP_DigestUpdate(ctx_->md, data, size) == 1, "sha256 update failed");
}

std::string Sha256::HexDigest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  KNNSERVE_CHECK(EVP_DigestFinal_ex(ctx_->md, digest, &length) == 1, "sha256 final failed");
  std::string hex;
  hex.reserve(2 * length);
  for (unsigned int i = 0; i < length; ++i) absl::StrAppendFormat(&hex, "%02x", digest[i]);
  return hex;
}

std::string Sha256Hex(absl::string_view data) {
  Sha256 sha;
  sha.Update(data.data(), data.size());
  return sha.HexDigest();
}

absl::StatusOr<std::unique_ptr<AtomicFileWriter>> AtomicFileWriter::Create(std::string path) {
  struct stat target;
  if (::stat(path.c_str(), &target) == 0 && !S_ISREG(target.st_mode)) {
    if (S_ISDIR(target.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat("cannot write ", path, ": a directory"));
    }
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoError("cannot open", path);
    return std::unique_ptr<AtomicFileWriter>(new AtomicFileWriter(std::move(path), "", fd));
  }
  std::string temp_path = TemporaryPath(path);
  const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot create", temp_path);
  return std::unique_ptr<AtomicFileWriter>(
      new AtomicFileWriter(std::move(path), std::move(temp_path), fd));
}

AtomicFileWriter::AtomicFileWriter(std::string path, std::string temp_path, int fd)
    : path_(std::move(path)), temp_path_(std::move(temp_path)), fd_(fd) {}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temp_path_.empty()) ::unlink(temp_path_.c_str());
}

absl::Status AtomicFileWriter::Append(const void* data, size_t size) {
  KNNSERVE_CHECK(!committed_ && fd_ >= 0, "Append after Commit");
  const char* p = static_cast<const char*>(data);
  size_t left = size;
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("cannot write", temp_path_.empty() ? path_ : temp_path_);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  sha_.Update(data, size);
  bytes_ += static_cast<int64_t>(size);
  return absl::OkStatus();
}

absl::StatusOr<FileDigest> AtomicFileWriter::Commit() {
  KNNSERVE_CHECK(!committed_ && fd_ >= 0, "Commit called twice");
  if (temp_path_.empty()) {  // in place: a device or FIFO, nothing to sync or rename
    const int rc = ::close(fd_);
    fd_ = -1;
    committed_ = true;
    if (rc != 0) return ErrnoError("cannot close", path_);
    return FileDigest{bytes_, sha_.HexDigest()};
  }
  if (::fsync(fd_) != 0) return ErrnoError("cannot fsync", temp_path_);
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) return ErrnoError("cannot close", temp_path_);
  const absl::Status published = RenameDurably(temp_path_, path_);
  // A failed rename leaves the temporary file for the destructor to remove.
  committed_ = published.ok() || !std::filesystem::exists(temp_path_);
  if (!published.ok()) return published;
  return FileDigest{bytes_, sha_.HexDigest()};
}

absl::StatusOr<FileDigest> WriteFileAtomically(const std::string& path, absl::string_view data) {
  absl::StatusOr<std::unique_ptr<AtomicFileWriter>> writer = AtomicFileWriter::Create(path);
  if (!writer.ok()) return writer.status();
  if (absl::Status s = (*writer)->Append(data); !s.ok()) return s;
  return (*writer)->Commit();
}

std::string PartialPath(const std::string& path) { return path + ".partial"; }

absl::Status PublishFile(const std::string& temp_path, const std::string& final_path) {
  const int fd = ::open(temp_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open", temp_path);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return ErrnoError("cannot fsync", temp_path);
  return RenameDurably(temp_path, final_path);
}

absl::Status CheckRoomFor(const std::string& path, int64_t final_bytes) {
  struct statvfs fs;
  if (::statvfs(DirectoryOf(path).c_str(), &fs) != 0) {
    return ErrnoError("cannot stat the file system of", path);
  }
  const int64_t free_bytes = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
  std::error_code error;
  const auto existing = std::filesystem::file_size(path, error);
  const int64_t needed = final_bytes - (error ? 0 : static_cast<int64_t>(existing));
  constexpr double kMiB = 1 << 20;
  if (needed > free_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s needs %.1f MiB more, its file system has %.1f MiB free", path,
                        needed / kMiB, free_bytes / kMiB));
  }
  struct rlimit limit;
  if (::getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
      static_cast<rlim_t>(final_bytes) > limit.rlim_cur) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s will hold %.1f MiB, over this process's file size limit of %.1f MiB (ulimit -f)", path,
        final_bytes / kMiB, limit.rlim_cur / kMiB));
  }
  return absl::OkStatus();
}

absl::Status CheckDistinctFiles(absl::Span<const NamedPath> paths) {
  for (size_t i = 0; i < paths.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      const NamedPath& a = paths[j];
      const NamedPath& b = paths[i];
      if (a.path.empty() || a.path == "-" || b.path.empty() || b.path == "-") continue;
      std::error_code error;
      const std::filesystem::file_status status = std::filesystem::status(a.path, error);
      // Devices (/dev/null) may take several streams; only files are overwritten.
      if (!error && std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
        continue;
      }
      const bool same_file = std::filesystem::equivalent(a.path, b.path, error) && !error;
      const bool same_path = std::filesystem::weakly_canonical(a.path, error) ==
                                 std::filesystem::weakly_canonical(b.path, error) &&
                             !error;
      if (same_file || same_path) {
        return absl::InvalidArgumentError(
            absl::StrCat(a.flag, " ", a.path, " and ", b.flag, " ", b.path, " name the same file"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DirectoryLock>> DirectoryLock::Acquire(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / kLockFileName).string();
  // A lock file can be unlinked by its holder (ReleaseAndRemoveIfEmpty), and the directory
  // with it: a lock taken on a file no longer at `path` guards nothing, so it is taken again.
  for (int attempt = 0;; ++attempt) {
    std::error_code error;
    std::filesystem::create_directories(dir, error);
    if (error) {
      return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", error.message()));
    }
    // Read-only: flock needs no write access, so users who share a directory share its lock.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoError("cannot open", path);
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd);
      if (err == EWOULDBLOCK) {
        return absl::FailedPreconditionError(absl::StrCat(
            "another knnserve command is writing ", dir, " (it holds ", path, "): wait for it"));
      }
      return absl::ErrnoToStatus(err, absl::StrCat("cannot lock ", path));
    }
    struct stat locked, current;
    if (::fstat(fd, &locked) == 0 && ::stat(path.c_str(), &current) == 0 &&
        locked.st_dev == current.st_dev && locked.st_ino == current.st_ino) {
      return std::unique_ptr<DirectoryLock>(new DirectoryLock(dir, fd));
    }
    ::close(fd);
    if (attempt == 100) {
      return absl::UnavailableError(absl::StrCat("cannot lock ", path, ": it keeps being removed"));
    }
  }
}

void DirectoryLock::ReleaseAndRemoveIfEmpty(std::unique_ptr<DirectoryLock> lock) {
  const std::filesystem::path dir(lock->dir_);
  std::error_code error;
  for (auto it = std::filesystem::directory_iterator(dir, error);
       !error && it != std::filesystem::directory_iterator(); it.increment(error)) {
    if (it->path().filename() != kLockFileName) return;
  }
  if (error) return;
  // Unlinked while still held: a command that opened it before finds, once it holds it, that
  // it is no longer the directory's lock file and starts over (Acquire); one that opens the
  // path after makes a new lock file, and then the directory is no longer empty and stays.
  std::filesystem::remove(dir / kLockFileName, error);
  lock.reset();
  std::filesystem::remove(dir, error);
}

DirectoryLock::~DirectoryLock() { ::close(fd_); }

std::string TemporaryPath(absl::string_view path) {
  return absl::StrCat(path, kTemporarySuffix, ::getpid());
}

int DirectoryLock::RemoveDebris(DebrisScope scope) const {
  int removed = 0;
  std::error_code error;
  for (auto it = std::filesystem::recursive_directory_iterator(dir_, error);
       !error && it != std::filesystem::recursive_directory_iterator(); it.increment(error)) {
    if (it.depth() == 0 && it->is_directory(error)) {
      if (scope == DebrisScope::kDirectory) it.disable_recursion_pending();
      continue;  // a subdirectory is searched, if at all, but not descended further
    }
    if (it.depth() > 0) it.disable_recursion_pending();
    if (!it->is_regular_file(error)) continue;
    const std::string name = it->path().filename().string();
    const size_t suffix = absl::string_view(name).rfind(kTemporarySuffix);
    if (suffix == std::string::npos) continue;
    pid_t pid = 0;
    if (!absl::SimpleAtoi(absl::string_view(name).substr(suffix + kTemporarySuffix.size()), &pid) ||
        pid <= 0 || ProcessRuns(pid)) {
      continue;
    }
    std::error_code ignored;
    if (std::filesystem::remove(it->path(), ignored)) ++removed;
  }
  return removed;
}

namespace {

// Size and SHA-256 of what is left to read of `fd` (`path` names it in errors).
absl::StatusOr<FileDigest> DigestRest(int fd, const std::string& path) {
  std::vector<char> buffer(4 << 20);
  Sha256 sha;
  FileDigest digest;
  while (true) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("cannot read", path);
    if (n == 0) break;
    sha.Update(buffer.data(), static_cast<size_t>(n));
    digest.bytes += n;
  }
  digest.sha256 = sha.HexDigest();
  return digest;
}

// Reads up to `size` bytes of `fd` into `data` (fewer only at the end of the file).
absl::StatusOr<size_t> ReadUpTo(int fd, void* data, size_t size, const std::string& path) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, static_cast<char*>(data) + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("cannot read", path);
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

absl::Status CheckDigest(const std::string& path, const FileDigest& actual,
                         const FileDigest& expected) {
  if (actual.bytes != expected.bytes || actual.sha256 != expected.sha256) {
    return absl::DataLossError(absl::StrCat(
        path, " has ", actual.bytes, " bytes, sha256 ", actual.sha256, "; the manifest says ",
        expected.bytes, " bytes, sha256 ", expected.sha256, " (truncated, corrupted or replaced)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<FileDigest> DigestFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open", path);
  absl::StatusOr<FileDigest> digest = DigestRest(fd, path);
  ::close(fd);
  return digest;
}

absl::Status VerifyFile(const std::string& path, const FileDigest& expected) {
  absl::StatusOr<FileDigest> actual = DigestFile(path);
  if (!actual.ok()) return actual.status();
  return CheckDigest(path, *actual, expected);
}

absl::StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return ErrnoError("cannot stat", path);
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
  const absl::StatusOr<size_t> done = ReadUpTo(fd, bytes.data(), bytes.size(), path);
  ::close(fd);
  if (!done.ok()) return done.status();
  if (*done < bytes.size()) {
    return absl::DataLossError(absl::StrCat("file shrank while reading: ", path));
  }
  return bytes;
}

absl::StatusOr<size_t> SpanReader::Read(void* data, size_t size) {
  const size_t n = std::min<size_t>(size, remaining());
  if (n > 0) std::memcpy(data, data_ + position_, n);  // data_ may be null for no bytes
  position_ += n;
  return n;
}

absl::StatusOr<std::unique_ptr<VerifiedFileReader>> VerifiedFileReader::Open(
    const std::string& path, const FileDigest& expected) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open", path);
  // Owned from here on, so that every return below closes it.
  std::unique_ptr<VerifiedFileReader> reader(
      new VerifiedFileReader(path, fd, static_cast<uint64_t>(expected.bytes)));
  ASSIGN_OR_RETURN(const FileDigest actual, DigestRest(fd, path));
  RETURN_IF_ERROR(CheckDigest(path, actual, expected));
  if (::lseek(fd, 0, SEEK_SET) != 0) return ErrnoError("cannot seek in", path);
  return reader;
}

VerifiedFileReader::VerifiedFileReader(std::string path, int fd, uint64_t size)
    : path_(std::move(path)), fd_(fd), remaining_(size), buffer_(1 << 20) {}

VerifiedFileReader::~VerifiedFileReader() { ::close(fd_); }

absl::StatusOr<size_t> VerifiedFileReader::Read(void* data, size_t size) {
  const size_t wanted = std::min<uint64_t>(size, remaining_);
  auto* out = static_cast<uint8_t*>(data);
  size_t done = 0;
  while (done < wanted) {
    if (buffer_begin_ == buffer_end_) {
      // Large reads (a list's codes, a whole array) go straight to their destination.
      if (wanted - done >= buffer_.size()) {
        ASSIGN_OR_RETURN(const size_t n, ReadUpTo(fd_, out + done, wanted - done, path_));
        done += n;
        break;
      }
      ASSIGN_OR_RETURN(buffer_end_, ReadUpTo(fd_, buffer_.data(), buffer_.size(), path_));
      buffer_begin_ = 0;
      if (buffer_end_ == 0) break;
    }
    const size_t n = std::min(wanted - done, buffer_end_ - buffer_begin_);
    std::memcpy(out + done, buffer_.data() + buffer_begin_, n);
    buffer_begin_ += n;
    done += n;
  }
  if (done < wanted) {  // the checked size is no longer there: changed in place
    return absl::DataLossError(
        absl::StrCat(path_, " ended ", remaining_ - done, " bytes early while being read"));
  }
  remaining_ -= done;
  return done;
}

}  // namespace knnserve
