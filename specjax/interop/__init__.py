"""Weights in other projects' layouts, read into specjax and written from it.

eagle        EAGLE-1/2 and EAGLE-3 drafters: SafeAILab's, SpecForge's and vLLM speculators' layouts
medusa       Medusa heads: FasterDecoding's (medusa_lm_head.*) and vLLM's layouts

(The file formats themselves, safetensors and torch.save's zip, are read and written by
``specjax.models.torch_files``, below both.)
"""
