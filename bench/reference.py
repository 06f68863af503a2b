"""The original DiT4DiT's per-step work, rebuilt from the SAME modules and weights as ours.

What the original does that our model does not (labelled B1-B5 here), each a small function here:

- B1 ``prompt_embeddings``: the text encoder runs on every step and every ``predict_action`` call
  (ours: a prompt cache built once per instruction);
- B2/B3 ``full_depth_features``: the feature pass runs every block and the output head with
  autograd on, and a forward hook on block ``extract_layer`` captures the features, detached; the
  graph stays referenced until the losses are computed (ours: stop after ``extract_layer``, no
  graph);
- B4 ``separate_condition_encode``: a second VAE encode, per sample, of frame 0 zero-padded to the
  clip length, stochastic ``latent_dist.sample()`` (ours: latent 0 of the one batched encode);
- B5 ``copied_repeats_loss``: the features are copied R times and each copy gets its own
  cross-attention K/V (ours: K/V once per sample, shared by its R noise draws).

``ReferenceDiT4DiT`` composes them around a built ``DiT4DiT``, whose modules it calls but never
changes: no flags in the model, no patching. Where the maths is equal (everything but B4's
stochastic sample) its losses and actions equal ours (``tests/test_models_reference.py``).
Imports only ``dit4dit_npu``, so tests can import it as ``bench.reference``.
"""

from __future__ import annotations

import torch

from dit4dit_npu import device as dev
from dit4dit_npu.batch import Batch
from dit4dit_npu.models import CosmosBackbone, DiT4DiT, FlowMatchingActionHead, PromptEncoder


def full_depth_features(
    backbone: CosmosBackbone,
    cond: torch.Tensor,
    prompt_embeds: torch.Tensor,
    num_latent_frames: int,
    call_seed: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """B2/B3: the whole transformer under ``enable_grad`` with a hook on block ``extract_layer``.
    -> (features detached, the full output; keep it alive as the original did)."""
    captured: list[torch.Tensor] = []
    block = backbone.transformer.transformer_blocks[backbone.cfg.extract_layer]
    handle = block.register_forward_hook(lambda _m, _i, out: captured.append(out))
    try:
        with torch.enable_grad(), dev.attention_context(backbone.cfg.attention_backend):
            inputs = backbone.feature_inputs(cond, prompt_embeds, num_latent_frames, call_seed)
            out = backbone.transformer(**inputs, return_dict=False)[0]
    finally:
        handle.remove()
    return captured[0].detach(), out


@torch.no_grad()
def separate_condition_encode(backbone: CosmosBackbone, first_frame: torch.Tensor, num_frames: int) -> torch.Tensor:
    """B4: (B, 3, 1, H, W) frame 0, zero-padded in pixel space to ``num_frames``, encoded one
    sample at a time with a posterior sample. -> normalised latent frame 0 (B, 16, 1, h, w)."""
    b, c, _, h, w = first_frame.shape
    clip = torch.cat([first_frame, first_frame.new_zeros(b, c, num_frames - 1, h, w)], dim=2)
    clip = backbone.pad_clip(clip).to(backbone.vae_dtype)
    latents = [backbone.vae.encode(clip[i : i + 1]).latent_dist.sample() for i in range(b)]
    return backbone.normalize(torch.cat(latents))[:, :, :1]


def copied_repeats_loss(
    head: FlowMatchingActionHead,
    features: torch.Tensor,
    state: torch.Tensor | None,
    actions: torch.Tensor,
    action_mask: torch.Tensor | None,
) -> torch.Tensor:
    """B5: K/V of R materialised feature copies ((R*B, S, D)), one copy per noisy sample."""
    kv = head.context_kv(features.repeat_interleave(head.repeats, dim=0))
    return head.loss_with_context(kv, 1, state, actions, action_mask)


class ReferenceDiT4DiT:
    """The original's training step and ``predict_action`` around our ``DiT4DiT`` (joint mode).

    ``separate_condition_encode=False`` leaves out B4, the one stochastic difference, so the
    result can be compared with ours exactly."""

    def __init__(self, model: DiT4DiT, encoder: PromptEncoder, separate_condition_encode: bool = True) -> None:
        if model.training_mode != "joint":
            raise ValueError(f"the reference step is the joint one; the model trains {model.training_mode!r}")
        self.model = model
        self.encoder = encoder  # held, like the original's text encoder; never part of the model
        self.separate_condition_encode = separate_condition_encode

    # ------------------------------------------------------------------ the stages

    def prompt_embeddings(self, instructions: list[str]) -> torch.Tensor:
        """B1: the text encoder on every call."""
        m = self.model
        if self.encoder.device != m.device:
            self.encoder.to(m.device)
        dtype = None if m.autocast else m.backbone.dtype
        return self.encoder.encode(list(instructions)).to(device=m.device, dtype=dtype)

    def condition(self, video: torch.Tensor, latents: torch.Tensor | None = None) -> torch.Tensor:
        """Conditioning latent of a (B, 3, T, H, W) clip (or its frame 0)."""
        bb = self.model.backbone
        if self.separate_condition_encode:  # B4, zero-padded to the training clip's length
            n = bb.padded_frames(self.model.spec.num_frames)
            return separate_condition_encode(bb, video[:, :, :1], max(n, video.shape[2]))
        if latents is None:
            latents = bb.encode_video(video[:, :, :1])
        return latents[:, :, :1]

    def features(
        self, cond: torch.Tensor, prompts: torch.Tensor, call_seed: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.model
        with dev.autocast(enabled=m.autocast):
            return full_depth_features(m.backbone, cond, prompts, m.feature_latent_frames, call_seed)

    # ------------------------------------------------------------------ step / inference

    def __call__(self, batch: Batch) -> dict[str, torch.Tensor]:
        """The original's training step: -> {"action_loss", "video_loss"}, as ``DiT4DiT.forward``."""
        m, bb = self.model, self.model.backbone
        batch.validate(m.spec, training=True)
        batch = batch.to(m.device)
        video = m.video_input(batch.frames)
        prompts = self.prompt_embeddings(batch.instruction)
        latents = bb.encode_video(video)  # the ground-truth clip (posterior mean)
        cond = self.condition(video, latents)
        feats, full_out = self.features(cond, prompts)
        with dev.autocast(enabled=m.autocast):
            action_loss = copied_repeats_loss(m.action_model, feats, batch.state, batch.action, batch.action_mask)
            video_loss = bb.video_flow_matching_loss(latents, prompts, cond)
        del full_out  # the original's discarded graph lived until here
        return {"action_loss": action_loss, "video_loss": video_loss}

    @torch.no_grad()
    def predict_action(self, batch: Batch, seed: int | None = None) -> torch.Tensor:
        m = self.model
        batch.validate(m.spec, training=False)
        batch = batch.to(m.device)
        was_training = m.training
        m.train(False)
        try:
            prompts = self.prompt_embeddings(batch.instruction)
            cond = self.condition(m.video_input(batch.frames[:, :1]))
            feats, _ = self.features(cond, prompts, call_seed=seed)
            g = torch.Generator().manual_seed(seed) if seed is not None else None
            return m.action_model.sample(feats, batch.state, g)
        finally:
            m.train(was_training)
