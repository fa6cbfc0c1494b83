"""ModelConfig: image options nest in ImageOptions; the flat dicts of before the nesting still load."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lightning_bpd.decoding import blockwise_decode, greedy_decode
from lightning_bpd.nn.config import ImageOptions, ModelConfig
from lightning_bpd.nn.model import BlockwiseTransformer

# A config as it was stored before the image options nested: every option at the top level.
OLD_FLAT = {
    "src_vocab_size": 20, "tgt_vocab_size": 20, "d_model": 32, "n_heads": 4, "n_encoder_layers": 1,
    "n_decoder_layers": 2, "d_ff": 64, "dropout": 0.0, "k": 3, "head_hidden": None, "identity_first": False,
    "head_type": "chained", "draft_vocab": None, "share_embeddings": False, "src_positions": "grid",
    "tgt_positions": "grid", "src_image_shape": (2, 2, 3), "tgt_image_shape": (8, 8, 3), "window": 16,
    "tie_output": False, "tie_output_to_source": True, "scale_positions": True, "direct_conditioning": True,
    "conditioning": "bilinear", "intensity_prior": 2.0, "intensity_output": "gaussian", "intensity_offset": 3,
    "head_centres": "own", "head_neighbours": True, "head_prior": "residual", "pad_id": 0, "bos_id": 1,
    "eos_id": None,
}
NESTED = ModelConfig(
    src_vocab_size=20, tgt_vocab_size=20, d_model=32, n_heads=4, n_encoder_layers=1, n_decoder_layers=2, d_ff=64,
    dropout=0.0, k=3, head_type="chained", src_positions="grid", tgt_positions="grid", window=16, tie_output=False,
    tie_output_to_source=True, eos_id=None,
    image=ImageOptions((2, 2, 3), (8, 8, 3), scale_positions=True, direct_conditioning=True, conditioning="bilinear",
                       intensity_prior=2.0, intensity_output="gaussian", head_centres="own", head_neighbours=True,
                       head_prior="residual"),
)


def test_flat_and_nested_dicts_give_one_config():
    assert ModelConfig.from_dict(OLD_FLAT) == NESTED
    assert ModelConfig.from_dict(dataclasses.asdict(NESTED)) == NESTED  # the nested dict round-trips
    assert ModelConfig.from_dict(vars(NESTED)) == NESTED  # image as an ImageOptions
    assert ModelConfig(**dataclasses.asdict(NESTED)) == NESTED  # image as a dict
    text = {key: value for key, value in OLD_FLAT.items() if key in {f.name for f in dataclasses.fields(ModelConfig)}}
    text.update(src_positions="sinusoidal", tgt_positions="sinusoidal", tie_output=True, tie_output_to_source=False)
    old_text = {**text, "src_image_shape": None, "tgt_image_shape": None, "conditioning": "nearest"}
    assert ModelConfig.from_dict(old_text) == ModelConfig(**text) and ModelConfig(**text).image is None


def test_image_options_without_shapes_are_refused():
    with pytest.raises(ValueError, match="need src_image_shape and tgt_image_shape"):
        ModelConfig.from_dict({"src_vocab_size": 20, "tgt_vocab_size": 20, "direct_conditioning": True})


def test_a_checkpoint_with_the_old_flat_config_loads_and_decodes_identically(tmp_path):
    """A checkpoint that stored its config flat: rebuilt through ``from_dict``, the weights load strictly and the
    model decodes as the one built from the nested config."""
    torch.manual_seed(0)
    model = BlockwiseTransformer(NESTED).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # weights large enough that the heads disagree with p_1
            if p.dim() == 2:
                p.normal_(0, 0.3 if name.startswith("head.") else 1.0 / p.shape[1] ** 0.5)
    torch.save({"config": OLD_FLAT, "state_dict": model.state_dict()}, tmp_path / "old.pt")

    ckpt = torch.load(tmp_path / "old.pt", weights_only=False)
    loaded = BlockwiseTransformer(ModelConfig.from_dict(ckpt["config"])).double().eval()
    loaded.load_state_dict(ckpt["state_dict"], strict=True)
    src = torch.randint(3, 20, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        greedy, blocks = greedy_decode(loaded, src, 40), blockwise_decode(loaded, src, max_len=40)
        assert torch.equal(greedy.tokens, greedy_decode(model, src, 40).tokens)
        assert torch.equal(blocks.tokens, blockwise_decode(model, src, max_len=40).tokens)
        assert torch.equal(blocks.tokens, greedy.tokens)  # exact blockwise decoding is greedy
