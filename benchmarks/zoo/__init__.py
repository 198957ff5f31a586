"""The model zoo: capture breadth on real timm and transformers models, against torch.compile.

``timm_zoo`` and ``hf_zoo`` build one small model per timm family and per transformers
architecture (random weights, CPU, tiny configs); ``check`` runs one model under one compiler
and mode against eager; ``runner`` runs the zoo, a child process per model
(``python -m benchmarks.zoo --workers N --only PATTERN``); ``report`` writes the Markdown table
(the PyTorch 2 paper's Table 1 for the zoo) and the ranked list of capture gaps.
"""
