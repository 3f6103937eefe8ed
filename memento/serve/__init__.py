"""Serving a selector: the HTTP service (:mod:`memento.serve.app`, :mod:`memento.serve.http`), its worker
processes, the MCP tools, and the browser inspector of banks and runs.
"""
