#!/usr/bin/python3
"""Writes a small fairseq `transformer` checkpoint in fairseq's exact structure, for the
converter test: {"model": state_dict with fairseq's names (including the buffers fairseq
stores: *.version, embed_positions._float_tensor), "cfg": {"model": Namespace(...), ...},
"optimizer_history": ..., "extra_state": ...}, plus dict.src.txt / dict.tgt.txt.

    make_fairseq_checkpoint.py PIECES_FILE OUT_DIR

PIECES_FILE lists SentencePiece pieces (one per line); the dictionaries hold them in reverse
order, so fairseq ids differ from SentencePiece ids. Also writes expected.pt: {knnserve name:
tensor} for the parameters the converted model must contain.
"""
import argparse
import os
import sys

import torch

D, FFN, HEADS, LAYERS, MAX_POS, PAD = 32, 48, 4, 2, 64, 1


def linear(state, name, out_dim, in_dim, bias=True):
    state[name + ".weight"] = torch.randn(out_dim, in_dim)
    if bias:
        state[name + ".bias"] = torch.randn(out_dim)


def layer_norm(state, name):
    state[name + ".weight"] = 1 + 0.1 * torch.randn(D)
    state[name + ".bias"] = 0.1 * torch.randn(D)


def attention(state, name):
    for proj in ("k_proj", "v_proj", "q_proj", "out_proj"):
        linear(state, "%s.%s" % (name, proj), D, D)


def main():
    pieces_file, out_dir = sys.argv[1], sys.argv[2]
    torch.manual_seed(5)
    with open(pieces_file, encoding="utf-8") as f:
        pieces = [line.rstrip("\n") for line in f if line.strip()]
    symbols = list(reversed(pieces))
    for name in ("dict.src.txt", "dict.tgt.txt"):
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            for i, s in enumerate(symbols):
                f.write("%s %d\n" % (s, 1000 - i))
    vocab = 4 + len(symbols)

    state = {}
    embed = torch.randn(vocab, D) * D ** -0.5
    embed[PAD] = 0
    state["encoder.embed_tokens.weight"] = embed
    state["encoder.embed_positions.weight"] = torch.randn(MAX_POS + PAD + 1, D)
    for i in range(LAYERS):
        p = "encoder.layers.%d" % i
        attention(state, p + ".self_attn")
        layer_norm(state, p + ".self_attn_layer_norm")
        linear(state, p + ".fc1", FFN, D)
        linear(state, p + ".fc2", D, FFN)
        layer_norm(state, p + ".final_layer_norm")
    layer_norm(state, "encoder.layer_norm")
    state["encoder.version"] = torch.tensor([3.0])
    dec_embed = torch.randn(vocab, D) * D ** -0.5
    state["decoder.embed_tokens.weight"] = dec_embed
    state["decoder.embed_positions.weight"] = torch.randn(MAX_POS + PAD + 1, D)
    for i in range(LAYERS):
        p = "decoder.layers.%d" % i
        attention(state, p + ".self_attn")
        layer_norm(state, p + ".self_attn_layer_norm")
        attention(state, p + ".encoder_attn")
        layer_norm(state, p + ".encoder_attn_layer_norm")
        linear(state, p + ".fc1", FFN, D)
        linear(state, p + ".fc2", D, FFN)
        layer_norm(state, p + ".final_layer_norm")
    layer_norm(state, "decoder.layer_norm")
    state["decoder.output_projection.weight"] = dec_embed  # tied: fairseq stores both names
    state["decoder.version"] = torch.tensor([3.0])

    model_args = argparse.Namespace(
        arch="transformer", encoder_embed_dim=D, decoder_embed_dim=D,
        encoder_ffn_embed_dim=FFN, decoder_ffn_embed_dim=FFN, encoder_layers=LAYERS,
        decoder_layers=LAYERS, encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
        encoder_normalize_before=True, decoder_normalize_before=True, encoder_learned_pos=True,
        decoder_learned_pos=True, share_all_embeddings=False,
        share_decoder_input_output_embed=True, activation_fn="relu", dropout=0.3,
        attention_dropout=0.1, activation_dropout=0.0, max_source_positions=MAX_POS,
        max_target_positions=MAX_POS, no_scale_embedding=False, layernorm_embedding=False,
        adaptive_softmax_cutoff=None, no_token_positional_embeddings=False, adaptive_input=False)
    checkpoint = {
        "cfg": {"_name": None, "model": model_args,
                "task": {"_name": "translation", "source_lang": "en", "target_lang": "de"}},
        "model": state,
        "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion",
                               "optimizer_name": "FairseqAdam", "num_updates": 1234}],
        "extra_state": {"epoch": 3, "val_loss": 4.2},
        "last_optimizer_state": None,
    }
    torch.save(checkpoint, os.path.join(out_dir, "fairseq.pt"))
    expected = {k: v for k, v in state.items()
                if not k.endswith(".version") and k != "decoder.output_projection.weight"}
    torch.save(expected, os.path.join(out_dir, "expected.pt"))


if __name__ == "__main__":
    main()
