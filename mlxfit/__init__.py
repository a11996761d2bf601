"""mlxfit: will fine-tuning this model fit in this machine's memory?"""

__version__ = "0.1.0"
