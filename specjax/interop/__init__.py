"""Weights in other projects' layouts, read into specjax and written from it.

torch_files  safetensors and torch.save zip files (.pt, .bin) as numpy, without torch
medusa       Medusa heads: FasterDecoding's (medusa_lm_head.*) and vLLM's layouts
"""
