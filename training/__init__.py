"""Offline training with PyTorch Lightning (offline-training issue).

Planned: a LightningModule and DataModule for offline Q training from logged transitions
and Memento training pairs, and SimCSE contrastive fine-tuning of the encoder. Nothing
here yet; ``memento`` never imports this package at module level.
"""
