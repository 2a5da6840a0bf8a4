"""baselines/moba.py, the block router: the fast and reference paths agree in outputs, densities and gradients; the
router picks the blocks whose mean key best matches the query, only past blocks when causal, never a block of
padding, and ignores padded keys' content; the density is the count of the routed pattern; queries without an
admissible key output zeros; bad arguments are refused. The interface contract is tests/test_interface.py."""

import pytest
import torch

from baselines.moba import MoBAAttention, route
from conftest import DEVICE

DIM, H, D = 12, 3, 4


def make_pair(**budget):
    torch.manual_seed(0)
    fast = MoBAAttention(DIM, H, D, path="fast", **budget).double()
    reference = MoBAAttention(DIM, H, D, path="reference", **budget).double()
    reference.load_state_dict(fast.state_dict())
    return fast.to(DEVICE), reference.to(DEVICE)


def padding(batch: int, n: int) -> torch.Tensor:
    pad = torch.rand(batch, n, generator=torch.Generator().manual_seed(n)) < 0.3
    pad[0, : n // 2] = True  # leading padding: causal queries there see no key
    return pad


# one block (b ≥ N), N not a multiple of b, k = 0 (the own block only), k above the candidates, single-token blocks
@pytest.mark.parametrize("n, block, topk", [(1, 4, 2), (5, 8, 1), (13, 3, 1), (13, 3, 0), (16, 4, 9), (9, 1, 3)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.on_device
def test_fast_and_reference_agree(n, block, topk, causal, padded):
    fast, reference = make_pair(block=block, topk=topk)
    x = torch.randn(2, n, DIM, dtype=torch.float64).to(DEVICE).requires_grad_()
    pad = padding(2, n).to(DEVICE) if padded else None
    grad_out = torch.randn(x.shape, dtype=torch.float64).to(DEVICE)
    results = []
    for module in (fast, reference):
        y, stats = module(x, pad, causal)
        (y * grad_out).sum().backward()
        results.append([y.detach(), stats["density"], x.grad.clone()] + [p.grad.clone() for p in module.parameters()])
        x.grad = None
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_the_router_keeps_the_blocks_whose_mean_key_matches_the_query_best():
    """N = 8, b = 2: blocks 0-3. Keys along one axis: block means 1, 3, −2, 0.5 (block 1: keys 2 and 4). A query
    q = (1, 0) in block 0 gates blocks 1, 2, 3 at 3, −2, 0.5: k = 2 keeps blocks 1 and 3. Causal, the same query
    in block 3 may route to blocks 0-2 only: block 1, then block 0 (gate 1)."""
    k = torch.tensor([1.0, 1.0, 2.0, 4.0, -2.0, -2.0, 0.5, 0.5])[:, None] * torch.tensor([1.0, 0.0])  # (M, D)
    q = torch.zeros(8, 2)
    q[:, 0] = 1.0
    valid = torch.ones(1, 8, dtype=torch.bool)
    index, chosen = route(q[None, None], k[None, None], valid, 2, 2, causal=False)  # (1, 1, N, K)
    assert set(index[0, 0, 0].tolist()) == {1, 3} and chosen.all()
    index, chosen = route(q[None, None], k[None, None], valid, 2, 2, causal=True)
    assert set(index[0, 0, 7].tolist()) == {0, 1} and chosen[0, 0, 7].all()
    # causal block 1 has one past block: one real choice (block 0), the other slot empty; block 0 has none
    assert chosen[0, 0, 2].sum() == 1 and index[0, 0, 2][chosen[0, 0, 2]].tolist() == [0]
    assert not chosen[0, 0, :2].any()


def test_padded_keys_leave_the_block_means_and_a_block_of_padding_is_never_routed():
    """Block 1's valid key has mean key 5 whatever its padded neighbour holds; block 2 is all padding: with k = 2
    and two candidates, query 0 routes to blocks 1 and 3, never 2."""
    k = torch.tensor([[1.0], [1.0], [5.0], [100.0], [9.0], [9.0], [-1.0], [-1.0]])
    q = torch.ones(8, 1)
    valid = torch.tensor([[True, True, True, False, False, False, True, True]])
    index, chosen = route(q[None, None], k[None, None], valid, 2, 3, causal=False)
    assert set(index[0, 0, 0][chosen[0, 0, 0]].tolist()) == {1, 3}
    k2 = k.clone()
    k2[3] = -1000.0  # padded content
    assert torch.equal(route(q[None, None], k2[None, None], valid, 2, 3, causal=False)[0], index)


@pytest.mark.parametrize("causal", [False, True])
def test_density_is_the_brute_force_count_of_the_routed_pattern(causal):
    """Pairs counted one by one from the router's choice: own block (j ≤ i when causal) or a routed block, j valid,
    summed over valid queries, over Σ_b (valid count)²."""
    n, blk, topk = 11, 3, 1
    torch.manual_seed(1)
    module = MoBAAttention(DIM, H, D, block=blk, topk=topk)
    x, pad = torch.randn(2, n, DIM), padding(2, n)
    _, stats = module(x, pad, causal)
    q, k, _ = torch.nn.functional.pad(module.qkv(x), (0, 0, 0, 1)).view(2, n + 1, 3, H, D).unbind(2)
    valid = torch.nn.functional.pad(~pad, (0, 1), value=False)
    index, chosen = route(q.transpose(1, 2), k.transpose(1, 2), valid, blk, topk, causal)
    for h in range(H):
        pairs = 0
        for b in range(2):
            for i in range(n):
                routed = {int(p) for p, c in zip(index[b, h, i], chosen[b, h, i]) if c}
                for j in range(n):
                    own = j // blk == i // blk and (j <= i or not causal)
                    pairs += bool(valid[b, i] and valid[b, j] and (own or j // blk in routed))
        assert stats["density"][h].item() == pytest.approx(pairs / float(((~pad).sum(1) ** 2).sum()))


@pytest.mark.parametrize("path", ["fast", "reference"])
def test_queries_with_no_admissible_key_output_zeros_with_finite_gradients(path):
    """Causal with the first 8 tokens padded: queries 0-7 see no valid key (blocks of 4, k = 1)."""
    torch.manual_seed(0)
    module = MoBAAttention(DIM, H, D, block=4, topk=1, path=path)
    x = torch.randn(1, 12, DIM, requires_grad=True)
    pad = torch.zeros(1, 12, dtype=torch.bool)
    pad[0, :8] = True
    y, _ = module(x, pad, True)
    torch.testing.assert_close(y[0, :8], module.out.bias.expand(8, -1), rtol=0, atol=0)
    y.sum().backward()
    assert torch.isfinite(x.grad).all() and (x.grad[0, :8] == 0).all()


def test_full_routing_is_full_attention():
    """k at least the number of blocks: every query sees every admissible key, the output of softmax attention."""
    torch.manual_seed(0)
    module = MoBAAttention(DIM, H, D, block=2, topk=8).double()
    x = torch.randn(2, 7, DIM, dtype=torch.float64)
    for causal in (False, True):
        y, stats = module(x, None, causal)
        q, k, v = module.qkv(x).view(2, 7, 3, H, D).permute(2, 0, 3, 1, 4)
        dense = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.testing.assert_close(y, module.out(dense.transpose(1, 2).reshape(2, 7, H * D)))
        assert stats["density"].tolist() == pytest.approx([28 / 49 if causal else 1.0] * H)


def test_bad_arguments_are_clear_value_errors_and_the_repr_shows_the_budget():
    for budget, words in (
        (dict(block=0), "block must be >= 1"),
        (dict(topk=-1), "topk >= 0"),
        (dict(path="sparse"), "path must be"),
    ):
        with pytest.raises(ValueError, match=words):
            MoBAAttention(DIM, H, D, **budget)
    assert "block=16, topk=3, path=fast" in MoBAAttention(DIM, H, D, block=16, topk=3).extra_repr()
