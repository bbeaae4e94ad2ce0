from pathlib import Path

from setuptools import find_packages, setup

README = Path(__file__).with_name("README.md")

setup(
    name="deepgen_rl",
    version="0.1.0",
    description="MR-GRPO (multi-reward GRPO) reinforcement learning for the DeepGen 1.0 text-to-image model",
    long_description=README.read_text(encoding="utf-8") if README.is_file() else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["deepgen_rl", "deepgen_rl.*"]),
    include_package_data=True,
    package_data={"deepgen_rl": ["**/*.py", "**/*.yaml", "**/*.json"]},
    install_requires=[],  # pinned in requirements.txt, installed by scripts/setup_env.sh (torch first)
    entry_points={
        "console_scripts": [
            "deepgen-rl-train=deepgen_rl.grpo_deepgen:main",
            "deepgen-rl-ocr-service=deepgen_rl.services.ocr.app:main",
            "deepgen-rl-reward-server=deepgen_rl.services.reward.server:main",
            "deepgen-rl-unigenbench=deepgen_rl.evaluation.unigenbench:main",
        ]
    },
)
