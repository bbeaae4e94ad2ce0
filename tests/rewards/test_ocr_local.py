"""ocr_local (RapidOCR in this process, what the OCR service hosts): scores, nothing-to-score vs failure, batch-size
invariance."""
import torch
from PIL import Image

from deepgen_rl.rewards import get_reward
from deepgen_rl.services.ocr.launch import render_text_image
from deepgen_rl.services.ocr.scoring import ocr_score


def test_ocr_local_scores_skips_and_fails_per_image():
    images = [render_text_image("Hello World"), render_text_image("Hello World"), Image.new("RGB", (1, 4000), "white"),
              render_text_image("DeepGen")]
    prompts = ['"Hello World"', "no quoted text", '"thin"', 'logo "DeepGen"']
    reward = get_reward("ocr_local")
    out = reward(images, prompts)
    assert out.valid.tolist() == [True, False, False, True]
    assert out.scores[0] >= 0.9 and out.scores[3] >= 0.9
    assert out.scores[0].item() == ocr_score(prompts[0], out.info["texts"][0])  # the service's formula, exactly
    assert out.info["image_errors"][1] is None  # nothing to score: not an error
    assert "ResizeImgError" in out.info["image_errors"][2]
    singles = torch.cat([reward([im], [p]).scores for im, p in zip(images, prompts)])
    assert torch.equal(singles, out.scores)
