#include "common/datastore/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"

namespace knnserve {
namespace {

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(errno, absl::StrCat(what, " ", path));
}

absl::Status FsyncPath(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open", path);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return ErrnoError("cannot fsync", path);
  return absl::OkStatus();
}

}  // namespace

std::string PartialPath(const std::string& path) { return path + ".partial"; }

absl::Status PublishFile(const std::string& temp_path, const std::string& final_path) {
  if (absl::Status s = FsyncPath(temp_path, O_RDONLY); !s.ok()) return s;
  if (::rename(temp_path.c_str(), final_path.c_str()) != 0) {
    return ErrnoError(absl::StrCat("cannot rename ", temp_path, " to"), final_path);
  }
  std::string dir = std::filesystem::path(final_path).parent_path().string();
  if (dir.empty()) dir = ".";
  return FsyncPath(dir, O_RDONLY | O_DIRECTORY);
}

absl::StatusOr<FileDigest> DigestFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open", path);
  std::vector<char> buffer(4 << 20);
  Sha256 sha;
  FileDigest digest;
  while (true) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      absl::Status error = ErrnoError("cannot read", path);
      ::close(fd);
      return error;
    }
    if (n == 0) break;
    sha.Update(buffer.data(), static_cast<size_t>(n));
    digest.bytes += n;
  }
  ::close(fd);
  digest.sha256 = sha.HexDigest();
  return digest;
}

absl::Status VerifyFile(const std::string& path, const FileDigest& expected) {
  absl::StatusOr<FileDigest> actual = DigestFile(path);
  if (!actual.ok()) return actual.status();
  if (actual->bytes != expected.bytes || actual->sha256 != expected.sha256) {
    return absl::DataLossError(absl::StrCat(
        path, " has ", actual->bytes, " bytes, sha256 ", actual->sha256, "; the manifest says ",
        expected.bytes, " bytes, sha256 ", expected.sha256, " (truncated, corrupted or replaced)"));
  }
  return absl::OkStatus();
}

}  // namespace knnserve
