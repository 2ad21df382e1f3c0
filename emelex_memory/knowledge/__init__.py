"""Versioned workspace Knowledge: values, provenance and its source digest, distillation and its splitting."""
