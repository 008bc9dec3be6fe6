"""``nn.DataParallel`` over the cpu target's virtual devices gives the numbers of N GPUs."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from ascend_patch.config import Settings


class LossModel(nn.Module):
    """Returns its loss, as Hugging Face models do: a scalar per replica."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(self.lin(x), y)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(6, 4, generator=g), torch.randn(6, 1, generator=g)


def test_two_virtual_devices_give_the_one_device_loss_and_gradients(patched, monkeypatch):
    x, y = batch()
    single = LossModel()
    ref = single(x, y)
    ref.backward()

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    model = LossModel().cuda()
    dp = nn.DataParallel(model)
    assert dp.device_ids == [0, 1] and dp.output_device == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's "all input tensors were scalars" warning
        per_replica = dp(x.cuda(), y=y.cuda())
    assert per_replica.shape == (2,)  # one loss per replica, as on 2 GPUs
    torch.testing.assert_close(per_replica, torch.stack([single(x[:3], y[:3]), single(x[3:], y[3:])]))
    loss = per_replica.mean()  # what HF Trainer does when n_gpu > 1
    torch.testing.assert_close(loss, ref)
    loss.backward()
    torch.testing.assert_close(model.lin.weight.grad, single.lin.weight.grad)
    torch.testing.assert_close(model.lin.bias.grad, single.lin.bias.grad)


def test_outputs_are_gathered_along_dim_with_their_structure(patched, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")

    class Out(nn.Module):
        def forward(self, x, tag):
            return {"y": x * 2, "n": x.new_tensor([x.shape[0]]), "tags": (x[:, :1],), "none": None}

    dp = nn.DataParallel(Out())
    x = torch.arange(14.0).reshape(7, 2)
    out = dp(x, "t")
    assert torch.equal(out["y"], x * 2)
    assert out["n"].tolist() == [3.0, 3.0, 1.0]  # torch.chunk's split of 7 over 3 devices
    assert torch.equal(out["tags"][0], x[:, :1]) and out["none"] is None
    class Double(nn.Module):
        def forward(self, x):
            assert x.shape[1] <= 3  # each replica sees a chunk along dim 1
            return x * 2

    xt = x.t().contiguous()
    assert torch.equal(nn.DataParallel(Double(), dim=1)(xt), xt * 2)


def test_in_place_buffer_updates_survive_from_the_first_replica_only(patched, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(3)
    x = torch.randn(8, 3) * 4 + 1
    nn.DataParallel(bn)(x)
    ref = nn.BatchNorm1d(3)
    ref(x[:4])  # device_ids[0]'s chunk
    torch.testing.assert_close(bn.running_mean, ref.running_mean)
    torch.testing.assert_close(bn.running_var, ref.running_var)
    assert bn.num_batches_tracked.item() == 1


def test_one_device_and_a_short_batch(patched, monkeypatch):
    model = LossModel()
    x, y = batch()
    dp = nn.DataParallel(model)  # 1 virtual device: the module itself
    assert dp.device_ids == [0]
    torch.testing.assert_close(dp(x, y), model(x, y))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert nn.DataParallel(model)(x[:1], y[:1]).shape == (1,)  # one chunk: one replica, gathered


def test_device_ids_beyond_the_virtual_devices_are_refused(patched, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert nn.DataParallel(LossModel(), device_ids=["cuda:1", 0]).device_ids == [1, 0]
    with pytest.raises(ValueError, match=r"device 2 does not exist; the cpu target has 2 virtual device\(s\)"):
        nn.DataParallel(LossModel(), device_ids=[0, 2])


def test_the_functional_form_scatters_too(patched, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    model = LossModel()
    x, y = batch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = nn.parallel.data_parallel(model, (x, y))
        assert torch.nn.parallel.data_parallel(model, x[:2], module_kwargs={"y": y[:2]}).shape == (2,)
    torch.testing.assert_close(out, torch.stack([model(x[:3], y[:3]), model(x[3:], y[3:])]))


def test_remove_restores_data_parallel_by_identity():
    import ascend_patch

    init, forward, functional = nn.DataParallel.__init__, nn.DataParallel.forward, nn.parallel.data_parallel
    with ascend_patch.patched(Settings(device="cpu")):
        assert nn.DataParallel.forward is not forward and nn.parallel.data_parallel is not functional
    assert nn.DataParallel.__init__ is init and nn.DataParallel.forward is forward
    assert nn.parallel.data_parallel is functional
