# examples/tiny_gpt: a GPT in plain PyTorch on attn.torch.scaled_dot_product_attention(is_causal=True)
# learns to reverse sequences (held-out greedy accuracy), and its two attentions agree.
import os
import subprocess
import sys

import torch

EXAMPLE = os.path.join(os.environ.get("ATTN_EXAMPLES", os.path.join(os.path.dirname(__file__), "../../examples")),
                       "tiny_gpt")
sys.path.insert(0, EXAMPLE)
import tiny_gpt  # noqa: E402


def test_tiny_gpt_learns():
    r = subprocess.run([sys.executable, os.path.join(EXAMPLE, "tiny_gpt.py"), "--steps", "200", "--threads", "1",
                        "--min-accuracy", "0.9"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "attention: attn" in r.stdout and "held-out accuracy" in r.stdout


def test_attentions_agree():
    torch.manual_seed(0)
    ours = tiny_gpt.GPT(11, 16, attention="attn")
    ref = tiny_gpt.GPT(11, 16, attention="torch")
    ref.load_state_dict(ours.state_dict())
    tokens = torch.randint(0, 11, (3, 16))
    a, b = ours(tokens), ref(tokens)
    assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), (a - b).abs().max()
    a.sum().backward()
    b.sum().backward()
    for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-4, rtol=1e-4), name
