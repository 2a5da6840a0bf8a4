"""bench/model.py: heads, mask-aware pooling, causality of the LM, per-layer stats and the aux-loss hook."""

import pytest
import torch
from torch import nn

from baselines.full import FullAttention
from bench.model import Model, ModelConfig


def model(head, **overrides):
    cfg = dict(
        vocab_size=20,
        num_classes=5,
        head=head,
        max_len=12,
        dim=16,
        depth=3,
        heads=2,
        head_dim=8,
        mlp_dim=32,
        dropout=0.0,
    )
    cfg.update(overrides)
    torch.manual_seed(0)
    return Model(ModelConfig(**cfg), lambda layer: FullAttention(16, 2, 8)).eval()


def test_head_shapes_and_stats():
    tokens = torch.randint(20, (4, 12))
    logits, stats = model("cls")(tokens)
    assert logits.shape == (4, 5) and stats["density"].shape == (3, 2)
    assert model("token")(tokens)[0].shape == (4, 12, 5)
    assert model("lm")(tokens)[0].shape == (4, 12, 20)
    assert model("pair")(tokens, tokens2=torch.randint(20, (4, 9)))[0].shape == (4, 5)


def test_mean_pooling_ignores_padding():
    m = model("cls")
    tokens = torch.randint(1, 20, (2, 12))
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[:, 8:] = True
    logits, _ = m(tokens, mask)
    changed = tokens.clone()
    changed[:, 8:] = torch.randint(1, 20, (2, 4))
    torch.testing.assert_close(m(changed, mask)[0], logits)
    # pooling over the valid prefix equals running the unpadded sequence (no positional leak from padding)
    torch.testing.assert_close(m(tokens[:, :8])[0], logits, rtol=1e-5, atol=1e-5)


def test_lm_is_causal():
    m = model("lm")
    tokens = torch.randint(20, (1, 12))
    logits, stats = m(tokens)
    changed = tokens.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % 20
    torch.testing.assert_close(m(changed)[0][:, :7], logits[:, :7])
    assert stats["density"].mean().item() == pytest.approx(13 / 24)


def test_without_positional_embeddings_the_encoder_is_permutation_equivariant():
    m = model("token", pos_emb=False)
    tokens = torch.randint(20, (1, 12))
    perm = torch.randperm(12)
    torch.testing.assert_close(m(tokens[:, perm])[0], m(tokens)[0][:, perm], rtol=1e-5, atol=1e-5)


def test_factory_gets_each_layer_index_and_aux_losses_add_up():
    class Scaled(FullAttention):
        def __init__(self, layer):
            super().__init__(16, 2, 8)
            self.layer = layer

        def forward(self, x, key_padding_mask=None, causal=False, generator=None):
            y, stats = super().forward(x, key_padding_mask, causal, generator)
            return y, {**stats, "aux_loss": torch.tensor(float(self.layer))}

    cfg = ModelConfig(
        vocab_size=20, num_classes=5, head="cls", max_len=12, dim=16, depth=3, heads=2, head_dim=8, mlp_dim=32
    )
    m = Model(cfg, Scaled)
    assert [b.attn.layer for b in m.blocks] == [0, 1, 2]
    assert m(torch.randint(20, (2, 12)))[1]["aux_loss"].item() == 0 + 1 + 2


def test_bad_config_is_a_clear_error():
    with pytest.raises(ValueError, match="head"):
        ModelConfig(vocab_size=20, num_classes=5, head="seq2seq", max_len=12)
    with pytest.raises(ValueError, match="heads"):
        ModelConfig(vocab_size=20, num_classes=5, head="cls", max_len=12, heads=0)
    with pytest.raises(ValueError, match="exceeds max_len"):
        model("cls")(torch.randint(20, (1, 13)))


def test_generator_reaches_the_attention():
    seen = []

    class Recorder(nn.Module):
        def forward(self, x, key_padding_mask=None, causal=False, generator=None):
            seen.append(generator)
            return x, {"density": torch.ones(2)}

    cfg = ModelConfig(
        vocab_size=20, num_classes=5, head="cls", max_len=12, dim=16, depth=2, heads=2, head_dim=8, mlp_dim=32
    )
    g = torch.Generator()
    Model(cfg, lambda layer: Recorder())(torch.randint(20, (1, 12)), generator=g)
    assert seen == [g, g]
