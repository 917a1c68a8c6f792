"""Device and precision choice, and the fine-tuning schedule (pure functions)."""

from __future__ import annotations

import pytest
import torch

from models.nets.backbone import autocast_dtype, pick_device
from models.training.finetune import linear_warmup_decay


def test_pick_device():
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert pick_device("auto").type == want
    assert pick_device("cpu").type == "cpu"
    with pytest.raises(ValueError, match="--device"):
        pick_device("tpu-please")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            pick_device("cuda")


def test_autocast_dtype():
    cpu = torch.device("cpu")
    assert autocast_dtype(cpu, "auto") is None  # fp32 on CPU
    assert autocast_dtype(cpu, "fp32") is None
    assert autocast_dtype(cpu, "bf16") is torch.bfloat16
    assert autocast_dtype(cpu, "fp16") is torch.float16
    with pytest.raises(ValueError, match="precision"):
        autocast_dtype(cpu, "int4")


def test_linear_warmup_then_linear_decay():
    total, warm = 100, 10  # 10% warm-up (Qu et al. §6.1)
    f = [linear_warmup_decay(s, total, warm) for s in range(total)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)  # rises to 1 ...
    assert all(b > a for a, b in zip(f[:10], f[1:10], strict=False))
    assert f[10] == pytest.approx(1.0) and f[55] == pytest.approx(0.5)  # ... then falls
    assert f[-1] == pytest.approx(1 / 90) and linear_warmup_decay(total, total, warm) == 0
    assert all(b < a for a, b in zip(f[10:], f[11:], strict=False))
