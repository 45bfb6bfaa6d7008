"""HuggingFace export of ``polar generate`` folders: parquet configs ``traces``, ``messages`` and ``preferences``, a
dataset card, and upload to the Hub (``polar_cli.export.hub``)."""

from polar_cli.export.exporter import ExportOptions, ExportReport, export
from polar_cli.export.split import stratified_test_keys

__all__ = ["ExportOptions", "ExportReport", "export", "stratified_test_keys"]
