"""Memory systems built over the one case bank: items of several kinds made by a frozen LLM from raw cases.

- :mod:`memento.systems.llm`: the builders' LLM calls (templates users can replace, a reply cache so a resumed
  run does not pay twice, calls and wall time counted) and the tolerant parsing of replies;
- :mod:`memento.systems.items`: items (``kind`` != ``"case"``) with provenance links to what they were made from,
  the link graph and its checks;
- :mod:`memento.systems.cfgm`: CFGM (focus points, contrastive tips, key-information reflection);
- :mod:`memento.systems.lifemem`: LifeMem (workflow clusters with adaptive split, skills).

The retrieval of each system is a policy in ``policies/`` (``cfgm``, ``lifemem``).
"""
