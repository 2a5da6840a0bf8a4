"""Every attention under torch.compile: the module compiled (TorchDynamo's graph capture, the "eager" backend, so
the suite stays fast), one forward and backward that equal the uncompiled module's bit for bit with the same
generator. SBM's sampler and sparse core run eagerly behind graph breaks (data-dependent sizes), so a compiled
model draws the same graphs."""

import pytest
import torch

from bench.methods import available, get

VARIANTS = (
    [(name, {}) for name in available() if name != "sbm"]
    + [("sbm", dict(path=path, clusters=4, density_weight=0.1)) for path in ("fast", "reference")]
    + [("kernel", dict(sparse=True, path="fast"))]
)


@pytest.mark.parametrize("name, options", VARIANTS, ids=[f"{n}-{o.get('path', '')}".strip("-") for n, o in VARIANTS])
def test_a_compiled_attention_gives_the_uncompiled_outputs_and_gradients(name, options):
    torch._dynamo.reset()
    method = get(name)
    kwargs = dict(options, **({"max_len": 32} if name in ("linformer", "kernel") else {}))
    torch.manual_seed(0)
    module = method.load()(16, 2, 8, 0.0, **kwargs).train()
    x = torch.randn(2, 32, 16)
    padding = torch.zeros(2, 32, dtype=torch.bool)
    padding[1, 27:] = True
    results = []
    for attention in (module, torch.compile(module, backend="eager", fullgraph=False)):
        inputs = x.clone().requires_grad_()
        y, stats = attention(
            inputs, key_padding_mask=padding, causal=method.causal, generator=torch.Generator().manual_seed(1)
        )
        (y.square().sum() + stats.get("aux_loss", 0)).backward()
        results.append((y.detach(), inputs.grad, stats["density"]))
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
