"""Data tasks: example generators and scorers, exposed natively and through SeqIO."""
