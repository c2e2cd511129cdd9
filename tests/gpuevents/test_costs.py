"""The cost model against hand-computed cases."""

from __future__ import annotations

import pytest

from gpuevents.config import CostsConfig, GpuCost
from gpuevents.costs import CostModel
from gpuevents.events import GpuInfo


def _costs(**kw: object) -> CostsConfig:
    base: dict[str, object] = {
        "currency": "USD",
        "energy_price_kwh": 0.10,
        "pue": 1.5,
        "models": {
            "H100": GpuCost(price=30000, depreciation_years=5, rated_power_w=700),
            "A100": GpuCost(price=15000, depreciation_years=4, rated_power_w=400),
            "A100 80GB": GpuCost(price=18250, depreciation_years=5, rated_power_w=400),
        },
        "default": GpuCost(price=3650, depreciation_years=1, rated_power_w=250),
    }
    base.update(kw)
    return CostsConfig.model_validate(base)


def test_daily_cost_is_depreciation_plus_measured_energy() -> None:
    model = CostModel(_costs())
    # 30000 / 5 / 365 = 16.438356...; 500 W × 24 h = 12 kWh × 0.10 × 1.5 = 1.80
    assert model.daily("NVIDIA H100 80GB HBM3", 500) == pytest.approx(30000 / 5 / 365 + 1.80)


def test_rated_power_stands_in_when_none_is_measured() -> None:
    model = CostModel(_costs())
    # 700 W × 24 h = 16.8 kWh × 0.10 × 1.5 = 2.52
    assert model.daily("H100", None) == pytest.approx(30000 / 5 / 365 + 2.52)


def test_hourly_is_daily_over_24() -> None:
    model = CostModel(_costs())
    # default: 3650 / 1 / 365 = 10.00 per day; 100 W → 2.4 kWh × 0.15 = 0.36; 10.36 / 24
    assert model.hourly("Tesla T4", 100) == pytest.approx(10.36 / 24)


def test_longest_matching_model_key_wins() -> None:
    model = CostModel(_costs())
    assert model.gpu_cost("NVIDIA A100-SXM4-80GB").price == 15000  # "A100 80GB" is not a substring
    assert model.gpu_cost("NVIDIA A100 80GB PCIe").price == 18250
    assert model.gpu_cost("nvidia a100 80gb pcie").price == 18250


def test_unknown_or_missing_model_uses_the_default() -> None:
    model = CostModel(_costs())
    assert model.gpu_cost(None).price == 3650
    assert model.gpu_cost("Radeon Instinct MI300X").price == 3650


def test_waste_is_idle_hours_times_hourly_cost() -> None:
    model = CostModel(_costs())
    # default at 0 W: 10.00 per day; 6 idle hours = 2.50
    assert model.waste("T4", 0, 6 * 3600) == pytest.approx(2.50)


def test_negative_measured_power_counts_as_zero() -> None:
    model = CostModel(_costs())
    assert model.daily(None, -5) == pytest.approx(10.0)


def test_format_uses_the_currency_symbol() -> None:
    assert CostModel(_costs()).format(12.4) == "$12.40"
    assert CostModel(_costs(currency="CNY")).format(88) == "¥88.00"
    assert CostModel(_costs(currency="EUR")).format(1234.5) == "€1,234.50"
    assert CostModel(_costs()).format(-3.1) == "-$3.10"


def test_format_writes_an_unknown_currency_code_after_the_amount() -> None:
    assert CostModel(_costs(currency="CHF")).format(7.005) in {"7.00 CHF", "7.01 CHF"}


def test_currency_comes_from_config() -> None:
    assert CostModel(_costs(currency="JPY")).currency == "JPY"


def _gpu(index: int, model: str, uuid: str = "", mig_parent: str | None = None) -> GpuInfo:
    return GpuInfo(node="n", index=index, uuid=uuid or f"GPU-{index}", model=model, mig_parent=mig_parent)


def test_a_mig_instance_costs_its_profiles_share_of_the_compute_slices() -> None:
    from gpuevents.costs import physical_shares

    parent = "GPU-a100"
    gpus = [_gpu(0, "NVIDIA A100-SXM4-40GB", parent),
            _gpu(1, "NVIDIA A100-SXM4-40GB MIG 3g.20gb", "MIG-1", parent),
            _gpu(2, "NVIDIA A100-SXM4-40GB MIG 2g.10gb", "MIG-2", parent),
            _gpu(3, "NVIDIA A100-SXM4-40GB MIG 1g.5gb", "MIG-3", parent),
            _gpu(4, "NVIDIA A100-SXM4-40GB MIG 1g.5gb", "MIG-4", parent)]
    shares = physical_shares(gpus)
    assert shares == pytest.approx({0: 0.0, 1: 3 / 7, 2: 2 / 7, 3: 1 / 7, 4: 1 / 7})


def test_instances_of_unknown_profile_split_their_gpu_equally() -> None:
    from gpuevents.costs import physical_shares

    gpus = [_gpu(0, "A100", "P"), _gpu(1, "A100", "M1", "P"), _gpu(2, "A100 MIG 3g.20gb", "M2", "P")]
    assert physical_shares(gpus) == pytest.approx({0: 0.0, 1: 0.5, 2: 0.5})
