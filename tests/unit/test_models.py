"""Specification of ember.models: the reference zoo, seeding and user model factories."""

from __future__ import annotations

import re
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from ember.data import load_dataset
from ember.errors import ConfigError
from ember.models import MODEL_NAMES, build_model

pytestmark = pytest.mark.timeout(60)

MNIST = (1, 28, 28)


def raises(message: str) -> Any:
    """Expect a ConfigError whose whole message is exactly `message`."""
    return pytest.raises(ConfigError, match=f"^{re.escape(message)}$")


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def linear_shapes(model: nn.Module) -> list[tuple[int, int]]:
    return [(m.in_features, m.out_features) for m in model.modules() if isinstance(m, nn.Linear)]


def test_model_names_are_the_four_reference_models() -> None:
    assert MODEL_NAMES == ("mlp", "logreg", "lenet", "cnn_bn")


def test_mlp_for_mnist_is_784_256_256_10_with_269322_parameters() -> None:
    model = build_model("mlp", MNIST, 10)
    assert linear_shapes(model) == [(784, 256), (256, 256), (256, 10)]
    assert count(model) == 269_322
    assert sum(isinstance(m, nn.ReLU) for m in model.modules()) == 2


def test_logreg_is_one_linear_layer_from_inputs_to_classes() -> None:
    model = build_model("logreg", (100,), 2)
    assert linear_shapes(model) == [(100, 2)] and count(model) == 202
    assert count(build_model("logreg", MNIST, 10)) == 7850


def test_lenet_for_mnist_is_lenet5_with_61706_parameters() -> None:
    model = build_model("lenet", MNIST, 10)
    convs = [
        (m.in_channels, m.out_channels, m.kernel_size, m.padding)
        for m in model.modules()
        if isinstance(m, nn.Conv2d)
    ]
    assert convs == [(1, 6, (5, 5), (2, 2)), (6, 16, (5, 5), (0, 0))]
    assert linear_shapes(model) == [(16 * 5 * 5, 120), (120, 84), (84, 10)]
    assert count(model) == 61_706


def test_lenet_computes_its_flatten_size_for_other_image_sizes() -> None:
    model = build_model("lenet", (3, 32, 32), 7)
    assert linear_shapes(model)[0] == (16 * 6 * 6, 120)
    assert model(torch.zeros(4, 3, 32, 32)).shape == (4, 7)


@pytest.mark.parametrize(
    "name, shape",
    [
        ("mlp", MNIST),
        ("mlp", (100,)),
        ("logreg", (100,)),
        ("logreg", MNIST),
        ("lenet", MNIST),
        ("cnn_bn", MNIST),
    ],
)
def test_every_model_outputs_logits_of_batch_by_num_classes(name: str, shape: tuple) -> None:
    model = build_model(name, shape, 3)
    assert model(torch.randn(5, *shape)).shape == (5, 3)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_same_seed_gives_identical_parameters_and_another_seed_differs(name: str) -> None:
    a, b, c = (build_model(name, MNIST, 10, seed=s).state_dict() for s in (5, 5, 6))
    assert all(torch.equal(a[k], b[k]) for k in a)
    # BatchNorm's weights start at 1 whatever the seed; every layer's matrix or kernel differs
    assert not any(torch.equal(a[k], c[k]) for k in a if k.endswith("weight") and a[k].dim() > 1)


def test_building_a_model_leaves_the_global_torch_rng_untouched() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_model("lenet", MNIST, 10, seed=9)
    assert torch.equal(torch.rand(3), expected)


def test_cnn_bn_for_mnist_has_two_batchnormed_convolutions_and_103066_parameters() -> None:
    model = build_model("cnn_bn", MNIST, 10)
    norms = [m.num_features for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert norms == [8, 16]
    assert linear_shapes(model) == [(16 * 7 * 7, 128), (128, 10)]
    assert count(model) == 103_066
    assert {name for name, _ in model.named_buffers()} >= {"1.running_mean", "5.running_var"}


def test_cnn_bn_on_vector_input_is_refused() -> None:
    with raises(
        "model 'cnn_bn' needs images (C, H, W) of at least 4x4; data has input shape (100,)"
    ):
        build_model("cnn_bn", (100,), 2)


def test_lenet_on_vector_input_is_refused() -> None:
    with raises("model 'lenet' needs image input (C, H, W); data has input shape (100,)"):
        build_model("lenet", (100,), 2)


def test_lenet_on_images_smaller_than_12x12_is_refused() -> None:
    build_model("lenet", (1, 12, 12), 10)
    with raises("model 'lenet' needs images of at least 12x12; data has input shape (1, 11, 11)"):
        build_model("lenet", (1, 11, 11), 10)


def test_unknown_model_name_lists_the_choices() -> None:
    choices = "mlp, logreg, lenet, cnn_bn"
    with raises(f"model must be one of {choices} or package.module:function; got 'foo'"):
        build_model("foo", MNIST, 10)


def test_bad_input_shape_or_num_classes_is_refused() -> None:
    with raises("input_shape must be one or more sizes >= 1, got ()"):
        build_model("mlp", (), 10)
    with raises("num_classes must be >= 1, got 0"):
        build_model("mlp", MNIST, 0)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One torch thread, as each ember worker runs; extra threads only contend on small batches."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize(
    "name, rows, floor", [("logreg", 10_000, 0.78), ("mlp", 10_000, 0.85), ("lenet", 3_000, 0.7)]
)
def test_each_reference_model_learns_digits_in_one_epoch(
    name: str, rows: int, floor: float
) -> None:
    data = load_dataset("digits")
    model = build_model(name, data.input_shape, data.num_classes)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.from_numpy(data.x_train[:rows]), torch.from_numpy(data.y_train[:rows])
    order = torch.randperm(rows, generator=torch.Generator().manual_seed(0))
    for batch in order.split(50):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
        opt.step()
    with torch.no_grad():
        predicted = model(torch.from_numpy(data.x_test)).argmax(1).numpy()
    assert (predicted == data.y_test).mean() > floor


# --- user factories ----------------------------------------------------------------------------


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], str]]:
    """Write a module with a fresh name onto sys.path; return its name. Removed afterwards."""
    names: list[str] = []
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(source: str) -> str:
        name = f"ember_user_{uuid.uuid4().hex}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        names.append(name)
        return name

    yield write
    for name in names:
        sys.modules.pop(name, None)


FACTORIES = """
    import torch
    from torch import nn

    CALLS = []

    def sized(input_shape, num_classes):
        CALLS.append((input_shape, num_classes))
        return nn.Sequential(nn.Flatten(), nn.Linear(int(torch.tensor(input_shape).prod()),
                                                     num_classes))

    def classes_only(num_classes, hidden=4):
        CALLS.append(num_classes)
        return nn.Sequential(nn.Flatten(), nn.Linear(784, hidden), nn.Linear(hidden, num_classes))

    def fixed():
        CALLS.append("fixed")
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 10))

    def anything(**kwargs):
        CALLS.append(kwargs)
        return nn.Sequential(nn.Flatten(), nn.Linear(784, kwargs["num_classes"]))

    def not_a_module():
        return {"weight": torch.zeros(3)}

    def three_logits():
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 3))

    def fails(input_shape):
        raise ValueError("bad factory")

    def normed():
        return nn.Sequential(nn.Flatten(), nn.BatchNorm1d(784), nn.Linear(784, 10))

    class Net:
        @staticmethod
        def create(num_classes):
            return nn.Sequential(nn.Flatten(), nn.Linear(784, num_classes))

    NOT_CALLABLE = 3
"""


def test_factory_receives_input_shape_and_num_classes_when_it_takes_them(user_module) -> None:
    name = user_module(FACTORIES)
    model = build_model(f"{name}:sized", MNIST, 10)
    assert sys.modules[name].CALLS == [(MNIST, 10)]
    assert linear_shapes(model) == [(784, 10)]


def test_factory_gets_only_the_keywords_its_signature_accepts(user_module) -> None:
    name = user_module(FACTORIES)
    build_model(f"{name}:classes_only", MNIST, 10)
    build_model(f"{name}:fixed", MNIST, 10)
    build_model(f"{name}:anything", MNIST, 10)
    build_model(f"{name}:Net.create", MNIST, 10)
    calls = sys.modules[name].CALLS
    assert calls == [10, "fixed", {"input_shape": MNIST, "num_classes": 10}]


def test_factory_models_are_seeded_like_the_reference_models(user_module) -> None:
    name = user_module(FACTORIES)
    a, b, c = (build_model(f"{name}:sized", MNIST, 10, seed=s) for s in (1, 1, 2))
    assert torch.equal(a[1].weight, b[1].weight) and not torch.equal(a[1].weight, c[1].weight)


def test_factory_probe_leaves_batchnorm_statistics_and_training_mode_alone(user_module) -> None:
    model = build_model(f"{user_module(FACTORIES)}:normed", MNIST, 10)
    norm = model[1]
    assert model.training and norm.training and int(norm.num_batches_tracked) == 0
    assert torch.equal(norm.running_mean, torch.zeros(784))


def test_factory_that_cannot_be_imported_is_named_with_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", "/opt/a:/opt/b")
    spec = "no_such_pkg_ember_test.mod:fn"
    with raises(
        f"model factory {spec!r} cannot be imported: No module named 'no_such_pkg_ember_test';"
        f" looked in the working directory {tmp_path}, then PYTHONPATH (/opt/a, /opt/b) and the"
        " installed packages; check that no_such_pkg_ember_test/ or no_such_pkg_ember_test.py"
        " is in one of them, on every worker's machine"
    ):
        build_model(spec, MNIST, 10)


def test_factory_in_the_working_directory_is_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"ember_cwd_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(
        "from torch import nn\n\ndef make(num_classes):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(784, num_classes))\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        assert isinstance(build_model(f"{name}:make", MNIST, 10), nn.Module)
    finally:
        sys.modules.pop(name, None)


def test_factory_whose_own_import_is_missing_names_that_module(user_module) -> None:
    name = user_module("import no_such_dependency_ember_test\n")
    with raises(
        f"model factory '{name}:f' cannot be imported: No module named"
        " 'no_such_dependency_ember_test'"
    ):
        build_model(f"{name}:f", MNIST, 10)


def test_factory_module_that_raises_on_import_is_reported(user_module) -> None:
    name = user_module("raise RuntimeError('boom')\n")
    with raises(f"model factory '{name}:f' cannot be imported: RuntimeError: boom"):
        build_model(f"{name}:f", MNIST, 10)


FACTORY_ERRORS = {
    "missing attribute": (
        "nope",
        "model factory '{spec}': module '{name}' has no attribute 'nope'",
    ),
    "not callable": ("NOT_CALLABLE", "model factory '{spec}' is not callable (it is a int)"),
    "returns a dict": (
        "not_a_module",
        "model factory '{spec}' must return a torch.nn.Module, got dict",
    ),
    "raises": ("fails", "model factory '{spec}' raised ValueError: bad factory"),
    "wrong output width": (
        "three_logits",
        "model factory '{spec}' must output logits of shape (batch, 10); got (2, 3) for input of"
        " shape (2, 1, 28, 28)",
    ),
}


@pytest.mark.parametrize("attr, message", FACTORY_ERRORS.values(), ids=FACTORY_ERRORS.keys())
def test_bad_factory_gets_one_error_naming_it(user_module, attr: str, message: str) -> None:
    name = user_module(FACTORIES)
    spec = f"{name}:{attr}"
    with raises(message.format(spec=spec, name=name)):
        build_model(spec, MNIST, 10)


def test_factory_output_that_does_not_fit_the_data_is_reported(user_module) -> None:
    spec = f"{user_module(FACTORIES)}:fixed"
    with pytest.raises(
        ConfigError,
        match=re.escape(f"model factory {spec!r} fails on input of shape (2, 100): RuntimeError"),
    ):
        build_model(spec, (100,), 10)


def test_factory_spec_without_a_function_is_refused() -> None:
    with raises("model factory 'pkg.mod:' must look like package.module:function"):
        build_model("pkg.mod:", MNIST, 10)
