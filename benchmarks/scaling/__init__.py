"""The scaling model's commands (measure, validate, project, report), one module each; see benchmarks/scaling_model.py.

Imported with benchmarks/ on sys.path (the dispatcher puts it there), beside the model `sim`.
"""
