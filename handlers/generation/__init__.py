"""Generative text: a causal language model served many sequences at once (continuous batching).

settings.py   its handler settings (the model file's `handler:`), and what a preset serves over them
cache.py      the KV cache: one row per sequence slot, allocated once
sequences.py  what a sequence is asked for and gives back (Generation, Sink, Finish, Usage)
scheduler.py  the queue, admission, each token's fate: shared by both engines
engine.py     the scheduler thread: admit, prefill, decode every active slot per step
openvino_engine.py  the same scheduling, the steps computed by OpenVINO GenAI's pipeline
sampling.py   a request's sampling parameters, checked, and the next-token choice
stream.py     token ids -> text deltas, stop strings held back until they cannot match
api.py        request bodies (the kit's, OpenAI's completions and chat) -> a Request
answers.py    a request's answer in its API's shapes, whole or as server-sent events
fields.py     every field a body may hold: read, taken where it asks for nothing, or refused
grammar.py    response_format as a token mask (llguidance)
tools.py      tool calling: tools shown through the template, calls read from the answer
logprobs.py   a token's log-probability and its alternatives
lookup.py     prompt lookup: drafts guessed from a sequence's own text, checked in one forward
metrics.py    the engine's serving numbers (vLLM's meanings), in a file the router's /metrics renders
file_embedding.py  the input embedding's rows read from the checkpoint's file
file_pages.py a checkpoint's mapped pages let go once what was read from them is copied
"""
