"""`kvmigrate doctor` against emulated and stubbed servers, well and badly configured, and
`--print-serve-command`."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from click.testing import CliRunner, Result

from kvmigrate.cli import main
from kvmigrate.doctor import hosted_context, serve_command, tool_parser
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.serving import BackgroundServer

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def _emulator(**settings: Any) -> BackgroundServer:
    config = EmulatorSettings(profile="vllm", time_scale=0, **settings)
    return BackgroundServer(lambda: build_app(config)).start()


@pytest.fixture(scope="module")
def healthy() -> Iterator[BackgroundServer]:
    server = _emulator()
    yield server
    server.stop()


def doctor(*args: str) -> Result:
    return CliRunner().invoke(main, ["doctor", *args])


def checks(result: Result) -> dict[str, dict[str, Any]]:
    report = json.loads(result.stdout)
    return {c["name"]: c for c in report["checks"]}


def test_a_well_configured_vllm_passes(healthy: BackgroundServer) -> None:
    result = doctor("--base-url", healthy.url + "/v1", "--json")
    assert result.exit_code == 0, result.output
    found = checks(result)
    assert {name: c["status"] for name, c in found.items()} == {
        "reachable": "pass",
        "chat template": "pass",
        "prompt-token details": "pass",
        "prefix caching": "pass",
        "tool calling": "pass",
        "json mode": "pass",
        "responses chains": "pass",
        "max model len": "pass",
    }
    assert "cached" in found["prefix caching"]["detail"]
    assert "vllm:prefix_cache_hits_total" in found["prefix caching"]["detail"]


def test_prompt_token_details_off_fails_with_the_flag() -> None:
    server = _emulator(prompt_tokens_details=False)
    try:
        result = doctor("--base-url", server.url + "/v1")
    finally:
        server.stop()
    assert result.exit_code == 1
    assert "FAIL  prompt-token details" in result.stdout
    assert "fix: start vLLM with --enable-prompt-tokens-details" in result.stdout
    # the cache itself is still proven, from /metrics
    assert "ok    prefix caching" in result.stdout
    assert "1 required check(s) failed: prompt-token details" in result.stdout


def test_a_vllm_without_its_response_store_fails_the_chain_check_with_the_env_var() -> None:
    server = _emulator(responses_store=False)
    try:
        result = doctor("--base-url", server.url + "/v1", "--json")
    finally:
        server.stop()
    assert result.exit_code == 0, result.output  # optional: chat-only agents need no store
    check = checks(result)["responses chains"]
    assert check["status"] == "fail"
    assert "404" in check["detail"]
    assert check["fix"].startswith("start vLLM with VLLM_ENABLE_RESPONSES_API_STORE=1")


def test_a_cache_that_never_hits_fails_with_the_flag() -> None:
    server = _emulator(cache_capacity_tokens=0)
    try:
        result = doctor("--base-url", server.url + "/v1", "--json")
    finally:
        server.stop()
    assert result.exit_code == 1
    check = checks(result)["prefix caching"]
    assert check["status"] == "fail"
    assert "--enable-prefix-caching" in check["fix"]
    assert json.loads(result.stdout)["ok"] is False


def test_context_shorter_than_the_hosted_model_warns_from_the_config(tmp_path: Path) -> None:
    server = _emulator(max_model_len=8192)
    config = tmp_path / "config.yaml"
    config.write_text(
        f"""
backends:
  hosted: {{api_base: "https://api.openai.com/v1"}}
  vllm: {{api_base: "{server.url}/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: {LLAMA}}}
"""
    )
    try:
        result = doctor("--config", str(config), "--json")  # the candidate from the config
    finally:
        server.stop()
    assert result.exit_code == 0, result.output  # optional: a warning, not a failure
    check = checks(result)["max model len"]
    assert check["status"] == "warn"
    assert "8192 tokens < gpt-4o-mini's 128000" in check["detail"]
    assert check["fix"].startswith("start vLLM with --max-model-len 128000")


def test_unknown_model_and_unreachable_server_fail(healthy: BackgroundServer) -> None:
    result = doctor("--base-url", healthy.url + "/v1", "--model", "nope", "--json")
    assert result.exit_code == 1
    assert "--served-model-name nope" in checks(result)["reachable"]["fix"]
    result = doctor("--base-url", "http://127.0.0.1:9/v1")
    assert result.exit_code == 1
    assert "must end in /v1" in result.stdout
    assert "Traceback" not in result.output


def _stub(model: str, refuse: str) -> web.Application:
    """A vLLM-like server that refuses tool_choice auto, or every chat for lack of a template,
    with vLLM's own error messages."""

    async def models(_request: web.Request) -> web.Response:
        card = {"id": model, "object": "model", "root": model, "max_model_len": 4096}
        return web.json_response({"object": "list", "data": [card]})

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        message = None
        if refuse == "template":
            message = (
                "As of transformers v4.44, default chat template is no longer allowed, so you "
                "must provide a chat template if the tokenizer does not define one."
            )
        elif refuse == "tools" and body.get("tool_choice") == "auto":
            message = (
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                "to be set"
            )
        if message:
            error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
            return web.json_response({"error": error}, status=400)
        usage = {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10,
                 "prompt_tokens_details": {"cached_tokens": 0 if "Doctor" not in str(body) else 64}}  # fmt: skip
        choice = {"index": 0, "message": {"role": "assistant", "content": "{}"},
                  "finish_reason": "stop"}  # fmt: skip
        return web.json_response({"id": "x", "object": "chat.completion", "created": 1,
                                  "model": model, "choices": [choice], "usage": usage})  # fmt: skip

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    return app


@pytest.mark.parametrize(
    ("model", "parser"),
    [(LLAMA, "llama3_json"), ("Qwen/Qwen2.5-7B-Instruct", "hermes"),
     ("mistralai/Mistral-7B-Instruct-v0.3", "mistral"), ("openai/gpt-oss-20b", "openai")],
)  # fmt: skip
def test_tool_calling_off_names_the_parser_of_the_family(model: str, parser: str) -> None:
    with BackgroundServer(lambda: _stub(model, "tools")) as server:
        result = doctor("--base-url", server.url + "/v1", "--json")
    assert result.exit_code == 1
    check = checks(result)["tool calling"]
    assert check["status"] == "fail"
    assert check["fix"] == f"start vLLM with --enable-auto-tool-choice --tool-call-parser {parser}"
    assert "--enable-auto-tool-choice" in check["detail"]  # vLLM's own message, relayed


def test_missing_chat_template_names_the_flag() -> None:
    with BackgroundServer(lambda: _stub("my-model", "template")) as server:
        result = doctor("--base-url", server.url + "/v1")
    assert result.exit_code == 1
    assert "FAIL  chat template" in result.stdout
    assert "--chat-template" in result.stdout
    assert "skip  tool calling" in result.stdout


@pytest.mark.parametrize(
    ("model", "gpu", "tp", "parser"),
    [
        (LLAMA, "H100", 1, "llama3_json"),
        ("meta-llama/Llama-3.3-70B-Instruct", "H100", 4, "llama3_json"),
        ("meta-llama/Llama-3.3-70B-Instruct", "H200", 2, "llama3_json"),
        ("Qwen/Qwen2.5-32B-Instruct", "L4", 8, "hermes"),
        ("openai/gpt-oss-120b", "H100", 2, "openai"),
        ("mistralai/Mistral-Small-24B-Instruct-2501", "A100", 1, "mistral"),
    ],
)
def test_serve_command_flags(model: str, gpu: str, tp: int, parser: str) -> None:
    command = serve_command(model, gpu, 65536)
    argv = command.argv
    assert argv[:3] == ["vllm", "serve", model]
    for flag in ("--enable-prefix-caching", "--enable-chunked-prefill",
                 "--enable-prompt-tokens-details", "--enable-auto-tool-choice",
                 "--gpu-memory-utilization"):  # fmt: skip
        assert flag in argv
    assert argv[argv.index("--tool-call-parser") + 1] == parser
    assert argv[argv.index("--max-model-len") + 1] == "65536"
    if tp == 1:
        assert "--tensor-parallel-size" not in argv
    else:
        assert argv[argv.index("--tensor-parallel-size") + 1] == str(tp)
    assert all(flag.why.endswith(".") and len(flag.why) > 40 for flag in command.flags)


def test_print_serve_command_cli() -> None:
    result = doctor("--print-serve-command", "--model", LLAMA, "--gpu", "h200")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"vllm serve {LLAMA} \\\n")
    assert '--api-key "$VLLM_API_KEY"' in result.stdout
    assert "# --enable-prefix-caching: " in result.stdout
    bad = doctor("--print-serve-command", "--model", LLAMA, "--gpu", "TPU9")
    assert bad.exit_code == 2
    assert "unknown GPU" in bad.output
    missing = doctor("--print-serve-command", "--model", LLAMA)
    assert missing.exit_code == 2
    assert "--gpu" in missing.output


@pytest.mark.parametrize(
    ("names", "parser"),
    [(("tiny", "/models/Qwen2-0.5B"), "hermes"), (("meta-llama/Llama-4-Scout-17B",), "llama4_pythonic"),
     (("Qwen/Qwen3-Coder-30B",), "qwen3_coder"), (("deepseek-ai/DeepSeek-V3",), "deepseek_v3"),
     (("tiny", "/root/.cache/x"), None)],
)  # fmt: skip
def test_tool_parser_by_family(names: tuple[str, ...], parser: str | None) -> None:
    assert tool_parser(*names) == parser


@pytest.mark.parametrize(
    ("model", "window"),
    [("gpt-4o-mini", 128_000), ("gpt-4o-2024-08-06", 128_000), ("gpt-4.1-mini", 1_047_576),
     ("gpt-4", 8_192), ("azure/gpt-4o", 128_000), ("my-model", None)],
)  # fmt: skip
def test_hosted_context(model: str, window: int | None) -> None:
    assert hosted_context(model) == window


def test_serve_command_beyond_one_node_uses_pipeline_parallelism() -> None:
    # 70B in bf16 is about 140 GB: 16 L4s, two nodes of 8. Tensor parallelism 16 would
    # cross the network every layer; the command keeps it inside a node.
    command = serve_command("meta-llama/Llama-3.1-70B-Instruct", "L4", 65536)
    argv = command.argv
    assert argv[argv.index("--tensor-parallel-size") + 1] == "8"
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
    assert argv[argv.index("--distributed-executor-backend") + 1] == "ray"
    text = command.text()
    assert "2 nodes of 8 GPUs" in text
    assert "ray start --head" in text
    one_node = serve_command("meta-llama/Llama-3.3-70B-Instruct", "H100", 65536).argv
    assert "--pipeline-parallel-size" not in one_node


def test_serve_command_says_where_max_model_len_comes_from(tmp_path: Path) -> None:
    def reason(*args: str, cwd: Path | None = None) -> str:
        old = Path.cwd()
        os.chdir(cwd or tmp_path)
        try:
            result = doctor("--print-serve-command", "--model", LLAMA, "--gpu", "H100", *args)
        finally:
            os.chdir(old)
        assert result.exit_code == 0, result.output
        [line] = [x for x in result.stdout.splitlines() if x.startswith("# --max-model-len")]
        return line

    assert "the default 32768" in reason()
    assert "from --max-model-len" in reason("--max-model-len", "4096")
    with_config = tmp_path / "project"
    with_config.mkdir()
    shutil.copy(Path(__file__).resolve().parents[2] / "config.yaml", with_config)
    line = reason(cwd=with_config)  # the same command, where a config.yaml maps the model
    assert "128000" in line
    assert "gpt-4o-mini" in line
    assert "config.yaml" in line
