#include "client/model/checkpoint.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status_macros.h"

namespace knnserve::model {
namespace {

constexpr char kFormat[] = "knnserve.transformer";
constexpr int64_t kVersion = 1;

c10::impl::GenericDict MakeStringDict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}
using TensorDict = c10::Dict<std::string, at::Tensor>;

torch::Tensor BytesToTensor(const std::string& bytes) {
  torch::Tensor t = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

std::string TensorToBytes(const torch::Tensor& tensor) {
  torch::Tensor t = tensor.contiguous().to(torch::kUInt8);
  return std::string(static_cast<const char*>(t.data_ptr()), t.numel());
}

TensorDict ToTensorDict(const std::map<std::string, torch::Tensor>& tensors) {
  TensorDict dict;
  for (const auto& [name, tensor] : tensors) dict.insert(name, tensor.detach().cpu().contiguous());
  return dict;
}

absl::StatusOr<std::map<std::string, torch::Tensor>> FromTensorDict(const c10::IValue& value,
                                                                    absl::string_view what) {
  if (!value.isGenericDict()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: '", what, "' is not a dict"));
  }
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& entry : value.toGenericDict()) {
    if (!entry.key().isString() || !entry.value().isTensor()) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint: '", what, "' must map names to tensors"));
    }
    tensors[entry.key().toStringRef()] = entry.value().toTensor();
  }
  return tensors;
}

absl::StatusOr<c10::IValue> Get(const c10::impl::GenericDict& dict, const std::string& key) {
  auto it = dict.find(key);
  if (it == dict.end()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint has no '", key, "' entry"));
  }
  return it->value();
}

absl::Status CopyParameters(TransformerModel& model,
                            const std::map<std::string, torch::Tensor>& stored) {
  torch::NoGradGuard no_grad;
  std::set<std::string> used;
  for (auto& [name, param] : model->UniqueNamedParameters()) {
    auto it = stored.find(name);
    if (it == stored.end()) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint lacks parameter ", name));
    }
    if (it->second.sizes() != param.sizes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint parameter ", name, " has shape ", c10::str(it->second.sizes()),
                       ", the model expects ", c10::str(param.sizes())));
    }
    param.copy_(it->second.to(torch::kFloat));
    used.insert(name);
  }
  for (const auto& [name, tensor] : stored) {
    if (!used.count(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint parameter ", name, " is not part of this model"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> StringList(const c10::IValue& value,
                                                    absl::string_view what) {
  if (!value.isList()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: '", what, "' is not a list"));
  }
  std::vector<std::string> out;
  for (const c10::IValue& item : value.toListRef()) {
    if (!item.isString()) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint: '", what, "' holds a non-string"));
    }
    out.push_back(item.toStringRef());
  }
  return out;
}

absl::StatusOr<Vocabulary> ParseVocab(const c10::IValue& value) {
  if (!value.isGenericDict()) return absl::InvalidArgumentError("checkpoint: 'vocab' not a dict");
  const c10::impl::GenericDict dict = value.toGenericDict();
  Vocabulary vocab;
  ASSIGN_OR_RETURN(c10::IValue source, Get(dict, "source"));
  ASSIGN_OR_RETURN(c10::IValue target, Get(dict, "target"));
  ASSIGN_OR_RETURN(vocab.source, StringList(source, "vocab.source"));
  ASSIGN_OR_RETURN(vocab.target, StringList(target, "vocab.target"));
  return vocab;
}

c10::impl::GenericDict VocabDict(const Vocabulary& vocab) {
  c10::impl::GenericDict dict = MakeStringDict();
  c10::List<std::string> source, target;
  for (const std::string& s : vocab.source) source.push_back(s);
  for (const std::string& s : vocab.target) target.push_back(s);
  dict.insert("source", source);
  dict.insert("target", target);
  return dict;
}

absl::StatusOr<LoadedModel> Parse(const c10::IValue& root) {
  if (!root.isGenericDict()) return absl::InvalidArgumentError("checkpoint is not a dict");
  const c10::impl::GenericDict dict = root.toGenericDict();
  ASSIGN_OR_RETURN(c10::IValue format, Get(dict, "format"));
  if (!format.isString() || format.toStringRef() != kFormat) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a knnserve checkpoint (format must be '", kFormat, "')"));
  }
  ASSIGN_OR_RETURN(c10::IValue version, Get(dict, "version"));
  if (!version.isInt() || version.toInt() != kVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported checkpoint version (this build reads ", kVersion, ")"));
  }
  ASSIGN_OR_RETURN(c10::IValue config_json, Get(dict, "config"));
  if (!config_json.isString()) return absl::InvalidArgumentError("checkpoint config not a string");
  ASSIGN_OR_RETURN(TransformerConfig config,
                   TransformerConfig::FromJson(config_json.toStringRef()));

  LoadedModel loaded;
  loaded.model = TransformerModel(config);
  ASSIGN_OR_RETURN(c10::IValue params, Get(dict, "model"));
  ASSIGN_OR_RETURN(auto tensors, FromTensorDict(params, "model"));
  RETURN_IF_ERROR(CopyParameters(loaded.model, tensors));
  loaded.model->eval();

  ASSIGN_OR_RETURN(c10::IValue tokenizer, Get(dict, "tokenizer"));
  if (!tokenizer.isTensor()) return absl::InvalidArgumentError("checkpoint tokenizer not bytes");
  loaded.tokenizer = TensorToBytes(tokenizer.toTensor());

  if (auto it = dict.find("vocab"); it != dict.end()) {
    ASSIGN_OR_RETURN(loaded.vocab, ParseVocab(it->value()));
    if (static_cast<int64_t>(loaded.vocab.source.size()) != config.src_vocab_size ||
        static_cast<int64_t>(loaded.vocab.target.size()) != config.tgt_vocab_size) {
      return absl::InvalidArgumentError("checkpoint vocabulary sizes differ from the model's");
    }
  }
  if (auto it = dict.find("trainer"); it != dict.end() && it->value().isGenericDict()) {
    const c10::impl::GenericDict trainer = it->value().toGenericDict();
    ASSIGN_OR_RETURN(c10::IValue state, Get(trainer, "state"));
    ASSIGN_OR_RETURN(c10::IValue trainer_tensors, Get(trainer, "tensors"));
    TrainerState ts;
    if (!state.isString()) return absl::InvalidArgumentError("checkpoint trainer state");
    ts.json = state.toStringRef();
    ASSIGN_OR_RETURN(ts.tensors, FromTensorDict(trainer_tensors, "trainer.tensors"));
    loaded.trainer = std::move(ts);
  }
  return loaded;
}

}  // namespace

absl::Status SaveCheckpoint(const std::string& path, TransformerModel& model,
                            const std::string& tokenizer, const TrainerState* trainer,
                            torch::Dtype dtype, const Vocabulary& vocab) {
  if (dtype != torch::kFloat && dtype != torch::kHalf) {
    return absl::InvalidArgumentError("checkpoint dtype must be float32 or float16");
  }
  try {
    c10::impl::GenericDict root = MakeStringDict();
    root.insert("format", kFormat);
    root.insert("version", kVersion);
    root.insert("config", model->config().ToJson());
    root.insert("tokenizer", BytesToTensor(tokenizer));
    TensorDict params;
    for (const auto& [name, tensor] : model->UniqueNamedParameters()) {
      params.insert(name, tensor.detach().cpu().to(dtype).contiguous());
    }
    root.insert("model", params);
    if (!vocab.empty()) root.insert("vocab", VocabDict(vocab));
    if (trainer != nullptr) {
      c10::impl::GenericDict trainer_dict = MakeStringDict();
      trainer_dict.insert("state", trainer->json);
      trainer_dict.insert("tensors", ToTensorDict(trainer->tensors));
      root.insert("trainer", trainer_dict);
    }
    const std::vector<char> bytes = torch::pickle_save(c10::IValue(root));
    return WriteFileAtomically(path, absl::string_view(bytes.data(), bytes.size())).status();
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("saving checkpoint ", path, ": ", e.what_without_backtrace()));
  }
}

absl::StatusOr<std::unique_ptr<Tokenizer>> MakeTokenizer(const LoadedModel& loaded) {
  if (loaded.tokenizer.empty()) {
    return absl::FailedPreconditionError("the checkpoint holds no tokenizer model");
  }
  return Tokenizer::FromSerialized(loaded.tokenizer, loaded.vocab);
}

absl::StatusOr<LoadedModel> LoadCheckpoint(const std::string& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", path, " is a directory, not a .pt file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open checkpoint ", path));
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read checkpoint ", path));
  try {
    absl::StatusOr<LoadedModel> loaded = Parse(torch::pickle_load(bytes));
    if (!loaded.ok()) {
      return absl::Status(loaded.status().code(),
                          absl::StrCat(path, ": ", loaded.status().message()));
    }
    return loaded;
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read checkpoint ", path, ": ", e.what_without_backtrace()));
  }
}

}  // namespace knnserve::model
