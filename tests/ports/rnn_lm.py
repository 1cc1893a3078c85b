"""Recurrent language-model ports (issue 28): truncated backpropagation through time with a hidden state carried
from one batch to the next, kept where real loops keep it: on the model, on a trainer object, in the step's closure.

(The word-level LSTM with the hidden state on ``ctx`` is ``support.real_loops.word_lm_setup``; it is not repeated
here.) Every port is a paraphrase of its upstream loop at toy size, on a token stream generated from a seed. The
planted bugs are the ones these loops are known for: a hidden state not detached between batches (made to run with
``backward(retain_graph=True)``, the forums' usual answer to "Trying to backward through the graph a second time"),
and a checkpoint that leaves out state the run carries (the hidden state, a weight average).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

import tropt

from . import Bug, Port

VOCAB, SEQ, WIDTH = 16, 5, 8


def token_stream(n_tokens: int, seed: int = 0) -> torch.Tensor:
    """A text with structure: each token is mostly followed by the next one of a fixed cycle."""
    g = torch.Generator().manual_seed(seed)
    out = [int(torch.randint(0, VOCAB, (1,), generator=g))]
    for _ in range(n_tokens - 1):
        jump = bool(torch.rand((), generator=g) < 0.15)
        out.append(int(torch.randint(0, VOCAB, (1,), generator=g)) if jump else (out[-1] + 5) % VOCAB)
    return torch.tensor(out)


def time_major_batches(n_batches: int = 3, seed: int = 0) -> list:
    """pytorch/examples' ``batchify`` + ``get_batch``: (data (SEQ, WIDTH), target (SEQ * WIDTH,)) windows, each
    column a contiguous piece of the text, so batch i+1 continues batch i column by column."""
    stream = token_stream(WIDTH * (n_batches * SEQ + 1), seed)
    source = stream.view(WIDTH, -1).t().contiguous()
    return [(source[i:i + SEQ], source[i + 1:i + 1 + SEQ].reshape(-1)) for i in range(0, n_batches * SEQ, SEQ)]


def batch_first_batches(n_batches: int = 3, seed: int = 1) -> list:
    """char-rnn's ``CharSplitLMMinibatchLoader``: (x (WIDTH, SEQ), y (WIDTH, SEQ)) with y the next characters, row r
    of batch i+1 continuing row r of batch i."""
    stream = token_stream(WIDTH * n_batches * SEQ + 1, seed)
    x, y = stream[:-1].view(WIDTH, -1), stream[1:].view(WIDTH, -1)
    return [(x[:, i:i + SEQ], y[:, i:i + SEQ]) for i in range(0, n_batches * SEQ, SEQ)]


def detach(h):
    """``repackage_hidden``: cut the hidden state from the previous batch's graph (truncated BPTT)."""
    return h.detach() if isinstance(h, torch.Tensor) else tuple(detach(v) for v in h)


def columns(h, start: int, n: int, dim: int = 1):
    """This micro-batch's part of a (layers, batch, hidden) state (or a tuple of them)."""
    return h.narrow(dim, start, n) if isinstance(h, torch.Tensor) else tuple(columns(v, start, n, dim) for v in h)


def joined(parts: list, dim: int = 1):
    if isinstance(parts[0], torch.Tensor):
        return torch.cat(parts, dim)
    return tuple(torch.cat([p[i] for p in parts], dim) for i in range(len(parts[0])))


def split_time_major(batch, sizes):
    """split_fn for (data (seq, batch), target (seq * batch,)): columns of data and the matching targets."""
    data, target = batch
    grid = target.view(data.shape)
    out, start = [], 0
    for n in sizes:
        out.append((data[:, start:start + n], grid[:, start:start + n].reshape(-1)))
        start += n
    return out


# ------------------------------------------------------------------ word_language_model, hidden on the model
class GRUModel(nn.Module):
    """pytorch/examples ``RNNModel`` with ``--model GRU`` (encoder, GRU, decoder), keeping its hidden state itself:
    ``self.hidden`` holds the state the last batch ended with (a tensor attribute, not a buffer)."""

    def __init__(self, ninp: int = 12, nhid: int = 16, nlayers: int = 2) -> None:
        super().__init__()
        self.encoder = nn.Embedding(VOCAB, ninp)
        self.rnn = nn.GRU(ninp, nhid, nlayers)
        self.decoder = nn.Linear(nhid, VOCAB)
        self.nlayers, self.nhid = nlayers, nhid
        self.hidden: torch.Tensor | None = None

    def forward(self, data: torch.Tensor, hidden: torch.Tensor | None = None) -> tuple:
        output, hidden = self.rnn(self.encoder(data), hidden)
        return self.decoder(output).view(-1, VOCAB), hidden

    def init_hidden(self, bsz: int) -> torch.Tensor:
        return next(self.parameters()).new_zeros(self.nlayers, bsz, self.nhid)


def gru_loss(model: nn.Module, batch) -> torch.Tensor:
    data, targets = batch
    output, _ = model(data)  # from a zero state: what the probes and the evaluation see
    return F.nll_loss(F.log_softmax(output, -1), targets)


LR_WORD, CLIP_WORD = 1.0, 0.25


def word_lm_on_model_setup(*, attached: bool = False, save_hidden: bool | None = None) -> tropt.Setup:
    """pytorch/examples ``word_language_model/main.py`` ``train()``: per batch, ``repackage_hidden``,
    ``model.zero_grad()``, forward from the carried state, NLL of the log-softmax, ``backward()``,
    ``clip_grad_norm_(0.25)`` and the hand-written SGD update ``p.data.add_(p.grad, alpha=-lr)``; here the model
    keeps the carried state as ``model.hidden`` instead of a local variable.

    ``attached``: the planted bug, the state kept without ``repackage_hidden`` and ``backward(retain_graph=True)``
    added to silence "Trying to backward through the graph a second time". ``save_hidden``: a checkpoint of the
    user's own (the weights and the RNG, and the hidden state only when True).
    """

    def step(ctx, micro_batches):
        model = ctx.model
        net = getattr(model, "module", model)  # under DDP the step's model is wrapped
        model.train()
        sizes = [ctx.batch_size(mb) for mb in micro_batches]
        total = sum(sizes)
        hidden = net.hidden
        if hidden is None or hidden.size(1) != total:
            hidden = net.init_hidden(total)
        if not attached:
            hidden = detach(hidden)
        model.zero_grad()
        parts, start = [], 0
        for (data, targets), n in zip(micro_batches, sizes):
            output, part = model(data, columns(hidden, start, n))
            loss = F.nll_loss(F.log_softmax(output, -1), targets) * (n / total)
            loss.backward(retain_graph=attached)
            parts.append(part)
            start += n
        net.hidden = joined(parts)
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_WORD)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-LR_WORD)

    def save(ctx):
        state = {"model": ctx.model.state_dict(), "rng": torch.get_rng_state()}
        if save_hidden:
            state["hidden"] = getattr(ctx.model, "module", ctx.model).hidden
        return state

    def load(ctx, state):
        ctx.model.load_state_dict(state["model"])
        torch.set_rng_state(state["rng"])
        if save_hidden:
            getattr(ctx.model, "module", ctx.model).hidden = state["hidden"]

    torch.manual_seed(0)
    extra = {} if save_hidden is None else {"save_state": save, "load_state": load}
    return tropt.Setup(GRUModel(), gru_loss, None, time_major_batches(), step=step, split_fn=split_time_major,
                       size_fn=lambda b: b[0].size(1), grad_clip=CLIP_WORD, num_classes=VOCAB, **extra)


# ------------------------------------------------------------------ char-rnn, hidden on a trainer object
class CharLSTM(nn.Module):
    """char-rnn's ``LSTM.lstm``: one-hot characters through stacked LSTM layers with dropout between them, then a
    linear decoder to log-probabilities."""

    def __init__(self, hidden: int = 16, layers: int = 2) -> None:
        super().__init__()
        self.lstm = nn.LSTM(VOCAB, hidden, layers, batch_first=True)
        self.decoder = nn.Linear(hidden, VOCAB)
        self.layers, self.hidden_size = layers, hidden

    def forward(self, x: torch.Tensor, state=None) -> tuple:
        out, state = self.lstm(F.one_hot(x, VOCAB).float(), state)
        return self.decoder(out), state


def char_loss(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    logits, _ = model(x)
    return F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))


class CharRNNTrainer:
    """char-rnn's ``train.lua`` around its ``feval``: ``init_state_global`` is the state the last batch ended with,
    carried into the next one; gradients are clamped elementwise to ``grad_clip`` and RMSprop steps."""

    grad_clip = 5.0

    def __init__(self) -> None:
        self.init_state_global: tuple | None = None

    def step(self, ctx, micro_batches):
        model = ctx.model
        net = getattr(model, "module", model)  # under DDP the step's model is wrapped
        model.train()
        sizes = [ctx.batch_size(mb) for mb in micro_batches]
        total = sum(sizes)
        state = self.init_state_global
        if state is None or state[0].size(1) != total:
            state = tuple(torch.zeros(net.layers, total, net.hidden_size) for _ in range(2))
        ctx.optimizer.zero_grad()
        parts, start = [], 0
        for (x, y), n in zip(micro_batches, sizes):
            logits, part = model(x, columns(state, start, n))
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1)) * (n / total)
            loss.backward()
            parts.append(detach(part))
            start += n
        self.init_state_global = joined(parts)  # carried over: truncated BPTT
        torch.nn.utils.clip_grad_value_(model.parameters(), self.grad_clip)
        ctx.optimizer.step()


def char_rnn_setup() -> tropt.Setup:
    """karpathy/char-rnn ``train.lua``: minibatches of ``seq_length`` characters from ``CharSplitLMMinibatchLoader``,
    the LSTM's final state carried into the next batch (``init_state_global``), gradients clamped to
    ``[-grad_clip, grad_clip]`` and ``optim.rmsprop`` (decay 0.95; ``-learning_rate 1e-2`` instead of the default
    2e-3, for a toy run of a few dozen steps). The state lives on a trainer object whose bound method is the step."""
    trainer = CharRNNTrainer()
    torch.manual_seed(0)
    return tropt.Setup(CharLSTM(), char_loss, lambda m: torch.optim.RMSprop(m.parameters(), lr=1e-2, alpha=0.95),
                       batch_first_batches(), step=trainer.step, num_classes=VOCAB)


# ------------------------------------------------------------------ awd-lstm-lm, hidden in the step's closure
class AWDLSTM(nn.Module):
    """salesforce/awd-lstm-lm ``RNNModel`` at toy size: embedding, an LSTM, a decoder tied to the embedding; returns
    the last layer's (dropped) outputs too, for the activation regularisers."""

    def __init__(self, ninp: int = 12, nhid: int = 12) -> None:
        super().__init__()
        self.encoder = nn.Embedding(VOCAB, ninp)
        self.rnn = nn.LSTM(ninp, nhid)
        self.decoder = nn.Linear(nhid, VOCAB)
        self.decoder.weight = self.encoder.weight  # tie_weights
        self.nhid = nhid

    def forward(self, data: torch.Tensor, hidden=None) -> tuple:
        output, hidden = self.rnn(self.encoder(data), hidden)
        return self.decoder(output).view(-1, VOCAB), hidden, output


def awd_loss(model: nn.Module, batch) -> torch.Tensor:
    data, targets = batch
    output, _, _ = model(data)
    return F.cross_entropy(output, targets)


ALPHA, BETA, CLIP_AWD = 2.0, 1.0, 0.25


def awd_lstm_setup() -> tropt.Setup:
    """salesforce/awd-lstm-lm ``main.py`` ``train()``: ``hidden = repackage_hidden(hidden)`` each batch, the hidden
    state a variable of the training function carried from batch to batch (here a ``nonlocal`` of the step's
    closure), ``optimizer.zero_grad()``, cross-entropy plus activation regularisation (``alpha * h.pow(2).mean()``)
    and temporal activation regularisation (``beta * (h[1:] - h[:-1]).pow(2).mean()``), ``clip_grad_norm_(0.25)``
    and ``optimizer.step()`` (SGD)."""
    hidden = None

    def step(ctx, micro_batches):
        nonlocal hidden
        model = ctx.model
        model.train()
        sizes = [ctx.batch_size(mb) for mb in micro_batches]
        total = sum(sizes)
        if hidden is None or hidden[0].size(1) != total:
            hidden = tuple(torch.zeros(1, total, getattr(model, "module", model).nhid) for _ in range(2))
        hidden = detach(hidden)
        ctx.optimizer.zero_grad()
        parts, start = [], 0
        for (data, targets), n in zip(micro_batches, sizes):
            output, part, h = model(data, columns(hidden, start, n))
            raw = F.cross_entropy(output, targets)
            loss = raw + ALPHA * h.pow(2).mean() + BETA * (h[1:] - h[:-1]).pow(2).mean()
            (loss * (n / total)).backward()
            parts.append(part)
            start += n
        hidden = joined(parts)
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_AWD)
        ctx.optimizer.step()

    torch.manual_seed(0)
    return tropt.Setup(AWDLSTM(), awd_loss, lambda m: torch.optim.SGD(m.parameters(), lr=5.0), time_major_batches(),
                       step=step, split_fn=split_time_major, size_fn=lambda b: b[0].size(1), grad_clip=CLIP_AWD,
                       num_classes=VOCAB)


PORTS = [
    Port("word_lm_hidden_on_model", "rnn_lm", "pytorch/examples/word_language_model/main.py", word_lm_on_model_setup,
         bugs=(
             Bug("hidden_not_detached", "loop.zero_grad", ("model.hidden", "not detached"),
                 lambda: word_lm_on_model_setup(attached=True),
                 "pytorch/examples word_language_model repackage_hidden; PyTorch forums 'Trying to backward through "
                 "the graph a second time' answered with retain_graph=True", checks=("loop.zero_grad",)),
             Bug("hidden_not_in_checkpoint", "loop.resume", ("model.hidden",),
                 lambda: word_lm_on_model_setup(save_hidden=False),
                 "truncated BPTT resumed from a checkpoint of the weights only: the carried state restarts from "
                 "zeros", checks=("loop.resume",)),
         )),
    Port("char_rnn_trainer_object", "rnn_lm", "karpathy/char-rnn/train.lua", char_rnn_setup),
    Port("awd_lstm_closure", "rnn_lm", "salesforce/awd-lstm-lm/main.py", awd_lstm_setup),
]


# ------------------------------------------------------------------ the former corpus cases (tests/support/real_loops)
def word_lm_time_major_port() -> tropt.Setup:
    """pytorch/examples word_language_model/main.py: ``batchify`` to time-major (seq, batch) columns, flattened
    targets, the hidden state on ``ctx.hidden`` repackaged every batch (``Setup(batch_dim=1)``)."""
    from support.real_loops import word_lm_setup

    return word_lm_setup()


def word_lm_split_fn_port() -> tropt.Setup:
    """The same loop described by ``split_fn``/``size_fn`` instead of ``batch_dim``, two micro-batches per step."""
    from support.real_loops import word_lm_setup

    return word_lm_setup(layout="split_fn", k=2)


def lbfgs_port() -> tropt.Setup:
    """pytorch/examples time_sequence_prediction/train.py: two LSTMCells predicting sine waves, one full batch,
    ``optimizer.step(closure)`` with LBFGS (the closure zeroes, computes the loss, backpropagates)."""
    from support.real_loops import lbfgs_setup

    return lbfgs_setup()


def lbfgs_dropout_port() -> tropt.Setup:
    """The LBFGS sine predictor with dropout between its cells (a stochastic closure)."""
    from support.real_loops import lbfgs_setup

    return lbfgs_setup(dropout=0.2)


def _lbfgs_without_zero_grad() -> tropt.Setup:
    from support.real_loops import lbfgs_setup

    return lbfgs_setup(forget_zero_grad=True)


PORTS += [
    Port("word_lm_time_major_batch_dim", "rnn_lm", "pytorch/examples/word_language_model/main.py",
         word_lm_time_major_port),
    Port("word_lm_time_major_split_fn", "rnn_lm", "pytorch/examples/word_language_model/main.py",
         word_lm_split_fn_port),
    Port("lbfgs_closure", "rnn_lm", "pytorch/examples/time_sequence_prediction/train.py", lbfgs_port,
         bugs=(Bug("lbfgs_closure_without_zero_grad", "loop.zero_grad", ("plus the gradient left over from step 1",),
                   _lbfgs_without_zero_grad,
                   source="pytorch/examples time_sequence_prediction: the closure must call optimizer.zero_grad()"),)),
    Port("lbfgs_closure_dropout", "rnn_lm", "pytorch/examples/time_sequence_prediction/train.py", lbfgs_dropout_port),
]
