"""The data side: rows read from files (files.py), checked before the first step (validation.py), split across ranks
and resumed (loader.py) by the LightningDataModule (module.py); a prompt's length as the policy sees it
(prompt_tokens.py)."""

from lit_agentrl.data.files import DataFile, load_rows, read_data_file
from lit_agentrl.data.loader import PromptBatchLoader
from lit_agentrl.data.module import AgentPromptDataModule
from lit_agentrl.data.validation import load_and_validate, row_errors

__all__ = [
    "AgentPromptDataModule",
    "DataFile",
    "PromptBatchLoader",
    "load_and_validate",
    "load_rows",
    "read_data_file",
    "row_errors",
]
