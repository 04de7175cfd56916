"""The container image: its build context, the Dockerfile, the engines that build it, the checks CI runs."""
