"""handlers/outside_context.py: the Context TorchServe 0.12 gives a worker, built outside one."""

from handlers.outside_context import worker_context


def test_the_context_names_the_model_its_directory_and_its_handler_settings(tmp_path):
    context = worker_context(tmp_path, "lm", {"backend": "inductor"}, batch_size=4)
    assert context.model_name == "lm" and context.system_properties["model_dir"] == str(tmp_path)
    assert context.system_properties["batch_size"] == 4
    assert context.model_yaml_config == {"handler": {"backend": "inductor"}}
    assert context.manifest["model"]["modelName"] == "lm"
    context.metrics.add_counter("Requests", 1)  # the metrics cache is ready for a handler's own metrics
