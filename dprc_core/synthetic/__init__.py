"""Private synthetic data: generation from a DP model, the DP label histogram, the owner's report."""  # noqa: E501
