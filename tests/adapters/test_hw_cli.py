"""`deepserve hw predict`: layouts the hardware cannot hold exit 2 with one line naming the limit;
the new columns (--mtp, --pd-link) print."""

from __future__ import annotations

import pytest

from deepserve.cli import main


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(["hw", "predict", *argv])
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (("--model", "deepseek-r1", "--npu", "910c", "--tp", "1", "--dp", "2000", "--ep", "2000"),
         ("dp: DP2000", "768 910c dies", "DeepServe §2")),
        (("--model", "deepseek-r1", "--npu", "910b", "--tp", "1", "--dp", "288", "--ep", "288",
          "--redundant-experts", "32"), ("dp: ", "64 910b NPUs of the gen1 cluster", "--servers")),
        (("--model", "deepseek-r1", "--npu", "910c", "--tp", "1", "--dp", "512", "--ep", "512"),
         ("ep: 512 routed-expert ranks", "256 routed experts", "config.json")),
        (("--model", "llama3-70b", "--npu", "910b", "--tp", "8", "--pd-link", "hccs"),
         ("pd_link: 16 NPUs over hccs exceed one hccs domain of 8 NPUs", "DeepServe §2")),
        (("--model", "kimi-k2", "--npu", "910c", "--tp", "16", "--dp", "4", "--ep", "64",
          "--mtp", "0.9"), ("mtp: kimi-k2 ships no MTP module",)),
        (("--model", "llama3-8b", "--npu", "910c", "--tp", "1", "--servers", "49"),
         ("servers: a cm384 cluster has 1 to 48 servers",)),
        (("--model", "llama3-8b", "--npu", "910b", "--tp", "1", "--pd-link", "ub"),
         ("pd_link: a gen1 cluster has no ub link",)),
    ],
)  # fmt: skip
def test_refusals_are_one_line_exit_2(capsys, argv, needles):
    code, out, err = _run(capsys, *argv)
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)


def test_mtp_and_pd_columns_print(capsys):
    code, out, err = _run(
        capsys, "--model", "deepseek-r1", "--npu", "910c", "--tp", "1", "--dp", "32", "--ep",
        "32", "--mtp", "0.9", "--pd-link", "ub", "--batch-sizes", "8", "--contexts", "2048",
    )  # fmt: skip
    assert (code, err) == (0, "")
    header = next(line for line in out.splitlines() if line.lstrip().startswith("batch"))
    assert header.split() == ["batch", "context", "prefill_ms", "decode_ms", "decode_tok/s",
                              "mtp_tpot_ms", "mtp_tok/s", "kv_xfer_ms", "ttft_ms", "act_GB",
                              "fits_kv"]  # fmt: skip
    assert "npu-fork-ub" in out
