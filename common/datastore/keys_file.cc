#include "common/datastore/keys_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/datastore/hdf5_file.h"
#include "common/files.h"
#include "common/status_macros.h"

namespace knnserve {
namespace {

constexpr char kKeys[] = "/keys";

absl::Status FsyncFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot fsync ", path));
  return absl::OkStatus();
}

// FAILED_PRECONDITION naming the first identity attribute of `file` that differs.
absl::Status CheckIdentity(const Hdf5File& file,
                           const std::map<std::string, std::string>& identity) {
  for (const auto& [name, expected] : identity) {
    absl::StatusOr<std::string> actual = file.GetStringAttribute(name);
    if (!actual.ok() || *actual != expected) {
      return absl::FailedPreconditionError(absl::StrCat(
          file.path(), " was computed with ", name, " = \"", actual.ok() ? *actual : "(none)",
          "\", this run has \"", expected,
          "\": it belongs to another model, tokenizer or datastore (remove it or use another "
          "output directory)"));
    }
  }
  return absl::OkStatus();
}

// Whether /keys of `file` has the shape and dtype `spec` writes.
absl::StatusOr<bool> HasShape(const Hdf5File& file, const KeysFileSpec& spec) {
  ASSIGN_OR_RETURN(const auto shape, file.Shape(kKeys));
  ASSIGN_OR_RETURN(const Hdf5Type type, file.TypeOf(kKeys));
  const Hdf5Type expected_type = spec.fp16 ? Hdf5Type::kFloat16 : Hdf5Type::kFloat32;
  return shape.first == spec.rows && shape.second == spec.dim && type == expected_type;
}

// Creates the keys file at `path` under a temporary name and publishes it with its attributes
// set: a run killed while creating it leaves no file at `path` that looks resumable.
absl::StatusOr<std::unique_ptr<Hdf5File>> CreateKeysFile(const std::string& path,
                                                         const KeysFileSpec& spec) {
  const std::string fresh = path + ".new";
  {
    ASSIGN_OR_RETURN(std::unique_ptr<Hdf5File> file,
                     Hdf5File::Open(fresh, Hdf5File::Mode::kCreate));
    const int64_t bytes_per_row = static_cast<int64_t>(spec.dim) * (spec.fp16 ? 2 : 4);
    const int64_t chunk_rows =
        spec.chunk_rows > 0 ? spec.chunk_rows : std::max<int64_t>(1, (1 << 20) / bytes_per_row);
    RETURN_IF_ERROR(file->CreateMatrix(kKeys, spec.fp16 ? Hdf5Type::kFloat16 : Hdf5Type::kFloat32,
                                       spec.rows, spec.dim, chunk_rows));
    RETURN_IF_ERROR(file->SetAttribute("format", absl::string_view(kKeysFormat)));
    RETURN_IF_ERROR(file->SetAttribute("dim", static_cast<int64_t>(spec.dim)));
    RETURN_IF_ERROR(
        file->SetAttribute("dtype", absl::string_view(spec.fp16 ? "float16" : "float32")));
    for (const auto* attributes : {&spec.identity, &spec.layout}) {
      for (const auto& [name, value] : *attributes) {
        RETURN_IF_ERROR(file->SetAttribute(name, absl::string_view(value)));
      }
    }
    RETURN_IF_ERROR(file->SetAttribute("complete", int64_t{0}));
    RETURN_IF_ERROR(file->SetAttribute("rows_completed", int64_t{0}));
    RETURN_IF_ERROR(file->Close());
  }
  RETURN_IF_ERROR(PublishFile(fresh, path));
  return Hdf5File::Open(path, Hdf5File::Mode::kReadWrite);
}

}  // namespace

KeysFileWriter::KeysFileWriter(std::string path, KeysFileSpec spec, std::unique_ptr<Hdf5File> file,
                               int64_t rows_completed)
    : path_(std::move(path)),
      spec_(std::move(spec)),
      file_(std::move(file)),
      resumed_from_(rows_completed),
      rows_written_(rows_completed) {}

KeysFileWriter::~KeysFileWriter() = default;

absl::StatusOr<std::unique_ptr<KeysFileWriter>> KeysFileWriter::CreateOrResume(
    const std::string& path, const KeysFileSpec& spec) {
  if (spec.rows < 0 || spec.dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("keys: bad shape [", spec.rows, ", ", spec.dim, "]"));
  }
  const std::string partial = PartialPath(path);
  std::unique_ptr<Hdf5File> file;
  int64_t rows_completed = 0;
  // What a publish needs: the keys plus HDF5's metadata (chunk index, attributes).
  const int64_t final_bytes = spec.rows * spec.dim * (spec.fp16 ? 2 : 4) + (256 << 10);
  RETURN_IF_ERROR(CheckRoomFor(partial, final_bytes));
  std::error_code error;
  std::filesystem::remove(partial + ".new", error);  // a creation that never finished
  if (std::filesystem::exists(partial, error)) {
    absl::StatusOr<std::unique_ptr<Hdf5File>> opened =
        Hdf5File::Open(partial, Hdf5File::Mode::kReadWrite);
    if (!opened.ok()) {
      return absl::Status(opened.status().code(),
                          absl::StrCat("cannot resume ", partial,
                                       " (kept; is another process "
                                       "using it? HDF5 refuses files open elsewhere; remove it "
                                       "to start over): ",
                                       opened.status().message()));
    }
    file = *std::move(opened);
    RETURN_IF_ERROR(CheckIdentity(*file, spec.identity));
    ASSIGN_OR_RETURN(const bool same_shape, HasShape(*file, spec));
    // Other options: its rows are of no use.
    if (!same_shape || !CheckIdentity(*file, spec.layout).ok()) {
      RETURN_IF_ERROR(file->Close());
      file.reset();
      std::filesystem::remove(partial, error);
    }
  }
  if (file != nullptr) {
    ASSIGN_OR_RETURN(rows_completed, file->GetIntAttribute("rows_completed"));
    if (rows_completed < 0 || rows_completed > spec.rows) {
      return absl::DataLossError(
          absl::StrCat(partial, ": rows_completed ", rows_completed, " is out of range"));
    }
  } else {
    ASSIGN_OR_RETURN(file, CreateKeysFile(partial, spec));
  }
  return std::unique_ptr<KeysFileWriter>(
      new KeysFileWriter(path, spec, std::move(file), rows_completed));
}

absl::Status KeysFileWriter::Append(MatrixView<const float> rows) {
  KNNSERVE_CHECK(rows.cols == spec_.dim, "keys: wrong number of columns");
  KNNSERVE_CHECK(rows_written_ + rows.rows <= spec_.rows, "keys: more rows than the file holds");
  RETURN_IF_ERROR(file_->WriteRows(kKeys, rows_written_, rows));
  rows_written_ += rows.rows;
  return absl::OkStatus();
}

absl::Status KeysFileWriter::Checkpoint() {
  // Rows first, durable; only then the counter that says they are there.
  RETURN_IF_ERROR(file_->Flush());
  RETURN_IF_ERROR(FsyncFile(file_->path()));
  RETURN_IF_ERROR(file_->SetAttribute("rows_completed", rows_written_));
  return file_->Flush();
}

absl::StatusOr<FileDigest> KeysFileWriter::Commit() {
  KNNSERVE_CHECK(rows_written_ == spec_.rows, "keys: Commit before every row was written");
  RETURN_IF_ERROR(Checkpoint());
  RETURN_IF_ERROR(file_->SetAttribute("complete", int64_t{1}));
  RETURN_IF_ERROR(file_->Close());
  RETURN_IF_ERROR(PublishFile(PartialPath(path_), path_));
  return DigestFile(path_);
}

absl::StatusOr<bool> CompleteKeysFileMatches(const std::string& path, const KeysFileSpec& spec) {
  ASSIGN_OR_RETURN(std::unique_ptr<Hdf5File> file, Hdf5File::Open(path, Hdf5File::Mode::kReadOnly));
  ASSIGN_OR_RETURN(const int64_t complete, file->GetIntAttribute("complete"));
  if (complete != 1) {
    return absl::DataLossError(absl::StrCat(path, " is not marked complete"));
  }
  RETURN_IF_ERROR(CheckIdentity(*file, spec.identity));
  return HasShape(*file, spec);
}

}  // namespace knnserve
