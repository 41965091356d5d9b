"""Weights in other projects' layouts, read into specjax and written from it.

torch_files  safetensors and torch.save zip files (.pt, .bin) as numpy, without torch
eagle        EAGLE-1/2 and EAGLE-3 drafters: SafeAILab's, SpecForge's and vLLM speculators' layouts
medusa       Medusa heads: FasterDecoding's (medusa_lm_head.*) and vLLM's layouts
"""
