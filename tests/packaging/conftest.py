"""Packaging tests: what a project installing this repository gets."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "install: builds the wheel and installs it into a fresh virtual environment (offline)",
    )
