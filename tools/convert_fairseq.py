#!/usr/bin/python3
"""Converts a fairseq `transformer` checkpoint to a knnserve checkpoint.

    /usr/bin/python3 tools/convert_fairseq.py --checkpoint checkpoint_best.pt \
        --src-dict dict.en.txt --tgt-dict dict.de.txt [--spm sentencepiece.model] --out model.pt

Reads fairseq's checkpoint structure ({"model": state_dict, "cfg": {"model": ...}} or the older
{"model": ..., "args": Namespace}) with fairseq's parameter names, checks that the architecture is
one knnserve implements (encoder-decoder transformer, equal encoder/decoder widths, no adaptive
softmax, ...), and writes knnserve's checkpoint format (client/model/checkpoint.h): the same
tensors under the same names, a shared tensor stored once, plus the config, the SentencePiece
model and the dictionaries' symbols (knnserve uses fairseq's token ids as they are).

Needs only Debian's python3-torch (fairseq itself is not required: its Namespace/dict configs
unpickle without it; OmegaConf-pickled configs need omegaconf installed).
"""
import argparse
import json
import sys

import torch

FORMAT = "knnserve.transformer"
VERSION = 1
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # fairseq.data.Dictionary's default order

# fairseq's own defaults for the transformer architecture (transformer_legacy.base_architecture),
# used when an old checkpoint's args lack a field.
DEFAULTS = {
    "encoder_embed_dim": 512, "encoder_ffn_embed_dim": 2048, "encoder_layers": 6,
    "encoder_attention_heads": 8, "encoder_normalize_before": False, "encoder_learned_pos": False,
    "decoder_layers": 6, "decoder_attention_heads": 8, "decoder_normalize_before": False,
    "decoder_learned_pos": False, "attention_dropout": 0.0, "activation_dropout": 0.0,
    "activation_fn": "relu", "dropout": 0.1, "share_decoder_input_output_embed": False,
    "share_all_embeddings": False, "no_token_positional_embeddings": False,
    "adaptive_input": False, "no_scale_embedding": False, "layernorm_embedding": False,
    "max_source_positions": 1024, "max_target_positions": 1024, "cross_self_attention": False,
    "adaptive_softmax_cutoff": None, "tie_adaptive_weights": False, "quant_noise_pq": 0,
}


class ConversionError(Exception):
    pass


def model_args(checkpoint):
    """The model's hyper-parameters as a plain dict, from "cfg" (new) or "args" (old)."""
    source = None
    if checkpoint.get("cfg") is not None:
        cfg = checkpoint["cfg"]
        source = cfg["model"] if isinstance(cfg, dict) else getattr(cfg, "model")
    elif checkpoint.get("args") is not None:
        source = checkpoint["args"]
    if source is None:
        raise ConversionError("checkpoint has neither 'cfg' nor 'args': not a fairseq checkpoint")
    values = dict(source) if isinstance(source, dict) else dict(vars(source))
    merged = dict(DEFAULTS)
    merged.update({k: v for k, v in values.items() if v is not None or k in DEFAULTS})
    merged.setdefault("decoder_embed_dim", merged["encoder_embed_dim"])
    merged.setdefault("decoder_ffn_embed_dim", merged["encoder_ffn_embed_dim"])
    if "relu_dropout" in values and "activation_dropout" not in values:
        merged["activation_dropout"] = values["relu_dropout"]
    return merged


def check_supported(a):
    def need(cond, what):
        if not cond:
            raise ConversionError("unsupported fairseq architecture: " + what)
    arch = a.get("arch", a.get("_name", "transformer"))
    need(arch is None or str(arch).startswith("transformer"), "arch %r is not a transformer" % arch)
    need(a["encoder_embed_dim"] == a["decoder_embed_dim"],
         "encoder_embed_dim %s != decoder_embed_dim %s" % (a["encoder_embed_dim"], a["decoder_embed_dim"]))
    need(a.get("decoder_output_dim", a["decoder_embed_dim"]) == a["decoder_embed_dim"],
         "decoder_output_dim differs from decoder_embed_dim")
    need(a.get("decoder_input_dim", a["decoder_embed_dim"]) == a["decoder_embed_dim"],
         "decoder_input_dim differs from decoder_embed_dim")
    need(bool(a["encoder_learned_pos"]) == bool(a["decoder_learned_pos"]),
         "encoder_learned_pos and decoder_learned_pos differ")
    need(not a["no_token_positional_embeddings"], "no_token_positional_embeddings")
    need(not a["adaptive_input"], "adaptive_input")
    need(not a["adaptive_softmax_cutoff"], "adaptive_softmax_cutoff")
    need(not a["cross_self_attention"], "cross_self_attention")
    need(not a.get("quant_noise_pq"), "quant_noise_pq")
    need(a["activation_fn"] in ("relu", "gelu"), "activation_fn %r" % a["activation_fn"])
    need(not a.get("encoder_layers_to_keep") and not a.get("decoder_layers_to_keep"),
         "layers_to_keep (LayerDrop pruning)")


def read_dict(path):
    """fairseq Dictionary symbols in id order: the 4 specials, then the file's symbols."""
    symbols = list(SPECIALS)
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line:
                continue
            fields = line.rsplit(" ", 1)
            if len(fields) == 2 and fields[1] == "#fairseq:overwrite":
                fields = fields[0].rsplit(" ", 1)
            if len(fields) != 2:
                raise ConversionError("%s:%d: expected '<symbol> <count>'" % (path, line_no))
            symbols.append(fields[0])
    return symbols


def convert_state(state, a, src_vocab, tgt_vocab):
    skip_suffixes = ("._float_tensor", ".version")
    params = {k: v for k, v in state.items() if not k.endswith(skip_suffixes) and k != "version"}
    if "decoder.embed_out" in params:  # fairseq < 0.10 name of the untied output projection
        params["decoder.output_projection.weight"] = params.pop("decoder.embed_out")
    for side, vocab in (("encoder", src_vocab), ("decoder", tgt_vocab)):
        rows = params["%s.embed_tokens.weight" % side].shape[0]
        if rows != len(vocab):
            raise ConversionError("%s.embed_tokens has %d rows but its dictionary has %d symbols "
                                  "(wrong dict file?)" % (side, rows, len(vocab)))
    if a["share_all_embeddings"]:
        dec = params.pop("decoder.embed_tokens.weight", None)
        if dec is not None and not torch.equal(dec, params["encoder.embed_tokens.weight"]):
            raise ConversionError("share_all_embeddings is set but the embeddings differ")
    if a["share_decoder_input_output_embed"] or a["share_all_embeddings"]:
        out = params.pop("decoder.output_projection.weight", None)
        emb = params.get("decoder.embed_tokens.weight", params["encoder.embed_tokens.weight"])
        if out is not None and not torch.equal(out, emb):
            raise ConversionError("tied output projection differs from the embedding")
    return {k: v.detach().float().contiguous().clone() for k, v in params.items()}


def build_config(a, src_vocab, tgt_vocab):
    return {
        "src_vocab_size": len(src_vocab), "tgt_vocab_size": len(tgt_vocab),
        "pad_id": 1, "eos_id": 2,
        "d_model": a["encoder_embed_dim"],
        "encoder_layers": a["encoder_layers"], "decoder_layers": a["decoder_layers"],
        "encoder_heads": a["encoder_attention_heads"], "decoder_heads": a["decoder_attention_heads"],
        "encoder_ffn_dim": a["encoder_ffn_embed_dim"], "decoder_ffn_dim": a["decoder_ffn_embed_dim"],
        "encoder_normalize_before": bool(a["encoder_normalize_before"]),
        "decoder_normalize_before": bool(a["decoder_normalize_before"]),
        "learned_positions": bool(a["encoder_learned_pos"]),
        "max_source_positions": a["max_source_positions"],
        "max_target_positions": a["max_target_positions"],
        "share_all_embeddings": bool(a["share_all_embeddings"]),
        "share_decoder_input_output_embed":
            bool(a["share_decoder_input_output_embed"] or a["share_all_embeddings"]),
        "no_scale_embedding": bool(a["no_scale_embedding"]),
        "layernorm_embedding": bool(a["layernorm_embedding"]),
        "activation": a["activation_fn"],
        "dropout": float(a["dropout"]), "attention_dropout": float(a["attention_dropout"]),
        "activation_dropout": float(a["activation_dropout"]),
    }


def convert(checkpoint_path, src_dict, tgt_dict, spm_path, out_path):
    checkpoint = torch.load(checkpoint_path, map_location="cpu")
    if not isinstance(checkpoint, dict) or "model" not in checkpoint:
        raise ConversionError("%s has no 'model' entry: not a fairseq checkpoint" % checkpoint_path)
    a = model_args(checkpoint)
    check_supported(a)
    src_vocab, tgt_vocab = read_dict(src_dict), read_dict(tgt_dict)
    if a["share_all_embeddings"] and src_vocab != tgt_vocab:
        raise ConversionError("share_all_embeddings needs identical source and target dictionaries")
    spm = b""
    if spm_path:
        with open(spm_path, "rb") as f:
            spm = f.read()
    out = {
        "format": FORMAT, "version": VERSION,
        "config": json.dumps(build_config(a, src_vocab, tgt_vocab), indent=2),
        "tokenizer": torch.frombuffer(bytearray(spm), dtype=torch.uint8) if spm
                     else torch.zeros(0, dtype=torch.uint8),
        "model": convert_state(checkpoint["model"], a, src_vocab, tgt_vocab),
        "vocab": {"source": src_vocab, "target": tgt_vocab},
    }
    torch.save(out, out_path)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True, help="fairseq checkpoint (.pt)")
    parser.add_argument("--src-dict", required=True, help="fairseq dict.<src>.txt")
    parser.add_argument("--tgt-dict", required=True, help="fairseq dict.<tgt>.txt")
    parser.add_argument("--spm", help="SentencePiece model the dictionaries were built with")
    parser.add_argument("--out", required=True, help="knnserve checkpoint to write")
    args = parser.parse_args()
    try:
        out = convert(args.checkpoint, args.src_dict, args.tgt_dict, args.spm, args.out)
    except (ConversionError, KeyError, OSError) as e:
        print("error: %s" % e, file=sys.stderr)
        return 1
    n = sum(t.numel() for t in out["model"].values())
    print("wrote %s: %d tensors, %d parameters" % (args.out, len(out["model"]), n), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
