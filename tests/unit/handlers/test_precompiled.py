"""Precompiled backends (aoti, openvino) end to end on a tiny CNN: archive-time compile and
int8 calibration, then the real handler loading the artifacts and serving batches. The build's
guard (samples, int8 repair and refusal): test_precompile.py."""

from __future__ import annotations

import logging
import os
import tempfile

import pytest
import torch

from handlers.accuracy import AccuracyError, Reference, cosine_distance, relative_errors
from handlers.archive import bare_handler
from handlers.backends import DType, aoti, cpu_refusal
from handlers.backends.aoti import package_name
from handlers.backends.common import BuildSpec
from handlers.calibration import CALIBRATION_COUNT
from handlers.optimize import graphs_compiled
from handlers.precompile import HELD_OUT_SYNTHETIC, judged_in_worker, precompile, ship_evidence
from handlers.settings import ImageSettings
from handlers.typed_config import SettingsError, parse_settings
from tests.conftest import encode_image
from tests.unit.handlers.serving import image_handler, serve, statuses


def test_int8_needs_a_precompiled_backend():
    with pytest.raises(
        SettingsError,
        match=r"backend 'inductor' does not serve dtype 'int8' \(it serves bfloat16, float32\); "
        "for int8 choose backend aoti, openvino",
    ):
        parse_settings(ImageSettings, {"backend": "inductor", "dtype": "int8"})
    with pytest.raises(SettingsError, match="aoti_batch_sizes must be a non-empty list of sizes >= 1"):
        parse_settings(ImageSettings, {"backend": "aoti", "aoti_batch_sizes": [0, 4]})


@pytest.mark.parametrize(
    ("max_batch", "packaged", "buckets"),
    [(1, (1, 2, 4, 8), [1]), (3, (1, 2, 4, 8), [1, 2, 4]), (4, (8, 1), [1, 8]), (16, (1, 2), [1, 2, 16])],
)
def test_aoti_buckets_are_packaged_sizes(max_batch, packaged, buckets):
    settings = parse_settings(ImageSettings, {"backend": "aoti", "aoti_batch_sizes": list(packaged)})
    assert settings.serving_buckets(max_batch) == buckets


def test_a_batch_size_without_package_is_refused_by_name(tmp_path):
    settings = parse_settings(ImageSettings, {"backend": "aoti", "aoti_batch_sizes": [1, 2]})
    with pytest.raises(ValueError, match=r"batch sizes \[1, 2\], but serving needs \[16\]; lower batchSize"):
        aoti.build(None, settings, BuildSpec((), (1, 2, 16), tmp_path))


def test_cosine_distance_ignores_scale_not_direction():
    x = torch.randn(3, 10)
    assert cosine_distance(2 * x, x) == pytest.approx(0.0, abs=1e-6)
    assert cosine_distance(-x, x) == pytest.approx(2.0, abs=1e-6)
    assert relative_errors(2 * x, x).tolist() == pytest.approx([1.0] * 3)  # a rescaled answer is wrong


@pytest.mark.parametrize(
    "settings",
    [
        {"backend": "aoti", "dtype": "int8", "aoti_batch_sizes": [1, 2]},
        {"backend": "aoti", "aoti_batch_sizes": [1, 2]},
        {"backend": "openvino", "dtype": "int8"},
        {"backend": "openvino"},
    ],
    ids=["aoti-int8", "aoti-fp32", "openvino-int8", "openvino-fp32"],
)
def test_precompiled_archive_serves_batches_close_to_eager(image_archive, tiny_cnn, settings):
    config = {"architecture": "exported-program", **settings}
    handler = bare_handler("image_classification.py", config, image_archive)
    from handlers.loaders import load_model

    precompile(handler, load_model(handler.settings, image_archive), image_archive, progress=print)

    served, context = image_handler(image_archive, batch_size=2, top_k=10, **settings)
    assert served.buckets == [1, 2]
    assert served.optimized.backend.value == settings["backend"]
    images = [encode_image("RGB", (120 + 10 * i, 90)) for i in range(3)]
    responses = serve(served, context, [{"body": data} for data in images[:2]])  # one batch of 2
    responses += serve(served, context, [{"body": images[2]}])  # and one of 1
    assert statuses(context) == [200]
    from handlers.image import image_to_tensor

    for response, data in zip(responses, images, strict=True):
        with torch.inference_mode():
            expected = torch.softmax(tiny_cnn(image_to_tensor(data)[None])[0], 0)
        got = torch.tensor([response[str(i)] for i in range(10)])
        # float32: kernels differ by summation order only; int8: the same ranking, close values.
        tolerance = 0.02 if settings.get("dtype") == "int8" else 1e-4
        torch.testing.assert_close(got, expected, rtol=0, atol=tolerance)


@pytest.fixture
def aoti_archive(image_archive):
    settings = {"architecture": "exported-program", "backend": "aoti"}
    handler = bare_handler("image_classification.py", settings, image_archive)
    from handlers.loaders import load_model

    precompile(handler, load_model(handler.settings, image_archive), image_archive, progress=print)
    return image_archive


def test_a_precompiled_worker_checks_the_shipped_reference_without_the_eager_model(aoti_archive):
    (aoti_archive / "model.pt2").unlink()  # the eager model: a precompiled worker must not need it
    handler, context = image_handler(aoti_archive, backend="aoti")
    serve(handler, context, [{"body": encode_image("RGB", (64, 64))}])
    assert statuses(context) == [200] and 0 <= handler.optimized.accuracy_error < 1e-4

    reference = Reference.load(aoti_archive)
    Reference(reference.inputs, [-output for output in reference.outputs]).save(aoti_archive)
    with pytest.raises(AccuracyError, match="backend 'aoti' answers differently from eager on"):
        image_handler(aoti_archive, backend="aoti")


def test_a_loaded_package_leaves_no_files_behind_and_still_answers(aoti_archive, tmp_path, monkeypatch):
    # A worker TorchServe kills never runs the loader's destructor, which was what deleted its files.
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setenv("TMPDIR", "/a/tmpdir/of/the/user")
    handler, context = image_handler(aoti_archive, backend="aoti")
    assert list(scratch.iterdir()) == []
    assert os.environ["TMPDIR"] == "/a/tmpdir/of/the/user"
    serve(handler, context, [{"body": encode_image("RGB", (64, 64))}])  # the mapped library outlives its file
    assert statuses(context) == [200] and 0 <= handler.optimized.accuracy_error < 1e-4


def test_only_a_backend_compiled_in_the_worker_at_reduced_precision_is_judged_there_on_shipped_evidence():
    def judged(**settings):
        return judged_in_worker(parse_settings(ImageSettings, settings))

    assert judged(backend="inductor", dtype="bfloat16") and judged(backend="ipex", dtype="bfloat16")
    assert not judged(backend="inductor") and not judged(backend="eager")
    assert not judged(backend="openvino", dtype="bfloat16")  # the build itself judges a precompiled one


@pytest.mark.skipif(bool(cpu_refusal(DType.BFLOAT16)), reason="this CPU does not compute bf16")
def test_a_bf16_worker_judges_its_compiled_model_on_every_input_the_build_shipped(image_archive):
    from handlers.loaders import load_model

    settings = {"architecture": "exported-program", "backend": "inductor", "dtype": "bfloat16"}
    handler = bare_handler("image_classification.py", settings, image_archive)
    count = ship_evidence(handler, load_model(handler.settings, image_archive), image_archive)
    assert count == HELD_OUT_SYNTHETIC + CALIBRATION_COUNT  # every input the build judges, not a few check batches
    served, context = image_handler(image_archive, backend="inductor", dtype="bfloat16")
    serve(served, context, [{"body": encode_image("RGB", (64, 64))}])
    assert statuses(context) == [200] and 0 < served.optimized.accuracy_error < 0.05

    reference = Reference.load(image_archive)  # eager "answers" one input, the last, with its least likely class
    last = reference.outputs[-1]
    wrong = torch.zeros_like(last).scatter_(-1, last.argmin(-1, keepdim=True), 20.0)
    Reference(reference.inputs, [*reference.outputs[:-1], wrong]).save(image_archive)
    with pytest.raises(AccuracyError, match=rf"answers differently from eager on 1 of {count} check inputs"):
        image_handler(image_archive, backend="inductor", dtype="bfloat16")


def test_a_package_for_a_newer_cpu_is_refused_by_name(aoti_archive, monkeypatch):
    monkeypatch.setattr(aoti, "cpu_flags", lambda: frozenset({"sse4_2"}))  # older than the one that built it
    with pytest.raises(RuntimeError, match=r"model.aoti.b1.pt2 was compiled for (AVX\S+).*, but this CPU lacks \1"):
        aoti.build(None, parse_settings(ImageSettings, {"backend": "aoti"}), BuildSpec((), (1,), aoti_archive))


def test_aoti_archive_without_packages_names_the_fix(image_archive):
    with pytest.raises(
        Exception, match=f"{package_name(1)} is missing from the archive; rebuild it with `make archive`"
    ):
        image_handler(image_archive, backend="aoti")


def test_a_recompile_while_serving_is_logged(image_archive, caplog):
    before = graphs_compiled()
    handler, context = image_handler(image_archive, batch_size=4, backend="inductor")
    assert graphs_compiled() - before == 2  # batch 1, and one graph with a dynamic batch for 2 and 4
    with caplog.at_level(logging.INFO, logger="handlers.base"):
        serve(handler, context, [{"body": encode_image("RGB", (64, 64))}] * 2)
        assert "recompiled while serving" not in caplog.text
        assert "first batch at bucket 2, shape [2, 3, 224, 224] (2 request(s))" in caplog.text
        handler.optimized(torch.randn(2, 3, 224, 224))  # outside inference_mode: a guard initialize never met
        handler.recompiles.check("batch of 2 padded to 2")
    assert "recompiled while serving (1 new graph(s), batch of 2" in caplog.text
