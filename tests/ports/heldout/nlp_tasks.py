"""NLP ports (held-out probe "nlp"): BERT sequence classification with the HF Trainer, a hand-written masked-LM
pretraining loop, a packed causal LM with gradient checkpointing, sentence embeddings with in-batch negatives, and
token classification (NER). Tiny random-init configs, generated token data
paraphrased from the upstream named in
each builder, never copied.
"""

from __future__ import annotations

import tempfile

import torch
from torch import nn
from torch.nn import functional as F

import tropt
from ports import Bug, Port

# Special ids shared by the generated "tokenizer": 0 [PAD], 1 [CLS], 2 [SEP], 3 [MASK], 4 [UNK]; words from 5.
PAD, CLS, SEP, MASK, UNK, FIRST = 0, 1, 2, 3, 4, 5
VOCAB = 32


def word_level_tokenizer():
    """A ``PreTrainedTokenizerFast`` built in memory (no download): a WordLevel vocabulary w5..w31 with BERT's
    special tokens, so ``DataCollatorWithPadding`` pads with its own ``pad`` as it does for a hub tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": PAD, "[CLS]": CLS, "[SEP]": SEP, "[MASK]": MASK, "[UNK]": UNK}
    vocab.update({f"w{i}": i for i in range(FIRST, VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", CLS),
                                                                                               ("[SEP]", SEP)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
                                   mask_token="[MASK]", unk_token="[UNK]")


def bert_config(**kw):
    from transformers import BertConfig

    base = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                max_position_embeddings=24, pad_token_id=PAD)
    base.update(kw)
    return BertConfig(**base)


def word_sequences(n: int, seed: int, lo: int = 3, hi: int = 10) -> list[list[int]]:
    """Variable-length word-id sequences (no specials)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(lo, hi + 1, (1,), generator=g))
        out.append(torch.randint(FIRST, VOCAB, (length,), generator=g).tolist())
    return out


# ====================================================================== 1. BERT sequence classification, HF Trainer
SC_UP = "huggingface/transformers/examples/pytorch/text-classification/run_glue.py"


class SentimentDataset(torch.utils.data.Dataset):
    """Tokenized variable-length sentences (tokenizer(text, truncation=True), no padding: the collator pads); the
    label is 1 when the word w7 occurs (a learnable rule)."""

    def __init__(self, tok, n: int = 64, seed: int = 0) -> None:
        self.items = []
        for ids in word_sequences(n, seed, lo=2, hi=20):  # lengths vary widely: batches pad to different widths
            if len(self.items) % 2 == 0:
                ids[len(ids) // 2] = 7
            enc = tok(" ".join(f"w{i}" for i in ids), truncation=True)
            self.items.append({"input_ids": enc["input_ids"],
                               "attention_mask": enc["attention_mask"], "labels": int(7 in ids)})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return dict(self.items[i])


class NoMaskCollator:
    """BUG: a hand-written padding collator that pads input_ids with [PAD] but drops the attention mask (the model
    then attends to padding; transformers warns "We strongly recommend passing in an `attention_mask`")."""

    def __init__(self, tok) -> None:
        self.tokenizer = tok

    def __call__(self, features):
        n = max(len(f["input_ids"]) for f in features)
        ids = torch.full((len(features), n), PAD)
        for i, f in enumerate(features):
            ids[i, :len(f["input_ids"])] = torch.tensor(f["input_ids"])
        return {"input_ids": ids, "labels": torch.tensor([f["labels"] for f in features])}


def bert_trainer_setup(*, no_mask: bool = False, as_shipped: bool = False, max_steps: int = 200) -> tropt.Setup:
    """transformers ``examples/pytorch/text-classification/run_glue.py``: ``AutoModelForSequenceClassification``
    (a random-init tiny ``BertForSequenceClassification`` here), the tokenizer without padding and
    ``DataCollatorWithPadding`` (dynamic padding to the longest of each batch), ``Trainer`` with
    ``TrainingArguments(weight_decay=0.01, warmup_steps, lr_scheduler_type="linear", gradient_accumulation_steps=2,
    max_grad_norm=1.0)``: the Trainer's ``create_optimizer`` makes the decay / no-decay groups (biases and LayerNorm
    weights without decay), ``create_scheduler`` the linear warm-up. Checked through
    ``tropt.integrations.hf.setup_from_trainer``."""
    from transformers import BertForSequenceClassification, DataCollatorWithPadding, Trainer, TrainingArguments

    from tropt.integrations.hf import setup_from_trainer

    tok = word_level_tokenizer()
    torch.manual_seed(0)
    model = BertForSequenceClassification(bert_config(num_labels=2))
    args = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="nlp_sc_"), per_device_train_batch_size=8,
                             per_device_eval_batch_size=8, gradient_accumulation_steps=2, learning_rate=2e-3,
                             weight_decay=0.01, warmup_steps=2, lr_scheduler_type="linear", max_steps=max_steps,
                             max_grad_norm=1.0, report_to=[], use_cpu=True, save_strategy="no",
                             logging_strategy="no", seed=0, dataloader_num_workers=0)
    collator = NoMaskCollator(tok) if no_mask else DataCollatorWithPadding(tok)
    trainer = Trainer(model=model, args=args, train_dataset=SentimentDataset(tok), data_collator=collator,
                      eval_dataset=SentimentDataset(tok, n=16, seed=1), processing_class=tok)
    if not as_shipped:
        # transformers 5.x: BertForSequenceClassification.forward takes **kwargs, so the Trainer believes the model
        # normalises by num_items_in_batch and skips "/ gradient_accumulation_steps", but its CrossEntropyLoss() is a
        # per-micro-batch mean (transformers issue #47688): the gradient is K x too large. The documented
        # workaround (trl's RewardTrainer discussion, the Trainer docstring) is to declare the model does not:
        trainer.model_accepts_loss_kwargs = False
    return setup_from_trainer(trainer).replace(num_classes=2)


# ====================================================================== 2. masked-LM pretraining, hand-written loop
MLM_UP = "huggingface/transformers/examples/pytorch/language-modeling/run_mlm_no_trainer.py"
SEQ = 12


def mask_tokens(input_ids: torch.Tensor, special: torch.Tensor, *, p: float = 0.15,
                ignore_unmasked: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``DataCollatorForLanguageModeling.torch_mask_tokens``: each non-special token is chosen with probability
    ``p``
    labels are -100 on the others
    of the chosen, 80 % become [MASK], 10 % a random word, 10 % stay.
    ``ignore_unmasked=False`` plants the bug: labels are a copy of every token, so the loss also counts (and
    rewards copying) the unmasked ones."""
    labels = input_ids.clone()
    prob = torch.full(labels.shape, p)
    prob.masked_fill_(special, 0.0)
    chosen = torch.bernoulli(prob).bool()
    if ignore_unmasked:
        labels[~chosen] = -100
    else:  # BUG: only padding ignored; unmasked tokens keep their labels
        labels[special & (input_ids == PAD)] = -100
    ids = input_ids.clone()
    replaced = torch.bernoulli(torch.full(labels.shape, 0.8)).bool() & chosen
    ids[replaced] = MASK
    rand = torch.bernoulli(torch.full(labels.shape, 0.5)).bool() & chosen & ~replaced
    ids[rand] = torch.randint(FIRST, VOCAB, labels.shape)[rand]
    return ids, labels


def mlm_batches(n_batches: int = 4, batch: int = 16, seed: int = 0) -> list:
    """Padded-to-SEQ [CLS] w... [SEP] [PAD]... batches with a learnable structure (each word the previous + 1, with
    a random start), plus ``special_tokens_mask`` as the tokenizer returns it."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        ids = torch.full((batch, SEQ), PAD)
        for i in range(batch):
            length = int(torch.randint(4, SEQ - 1, (1,), generator=g))
            start = int(torch.randint(0, VOCAB - FIRST, (1,), generator=g))
            words = (start + torch.arange(length)) % (VOCAB - FIRST) + FIRST
            ids[i, 0], ids[i, 1:length + 1], ids[i, length + 1] = CLS, words, SEP
        special = (ids == PAD) | (ids == CLS) | (ids == SEP)
        out.append({"input_ids": ids, "attention_mask": (ids != PAD).long(), "special_tokens_mask": special})
    return out


def mlm_setup(*, ignore_unmasked: bool = True, k: int = 2) -> tropt.Setup:
    """transformers ``run_mlm_no_trainer.py`` (its collator ``DataCollatorForLanguageModeling(mlm_probability=0.15)``
    moved into the step, so every call draws its own mask: a stochastic step): a random-init ``BertForMaskedLM``,
    AdamW over decay / no-decay groups, ``get_scheduler("linear", num_warmup_steps)``. Its accumulation is made
    exact the way the Trainer's ``num_items_in_batch`` does it: token losses summed and divided by the cycle's
    number of masked tokens (the script's ``loss / gradient_accumulation_steps`` is the documented 2024 bug)."""
    from transformers import BertForMaskedLM, get_scheduler

    torch.manual_seed(0)
    model = BertForMaskedLM(bert_config(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1))

    def masked(batch):
        ids, labels = mask_tokens(batch["input_ids"], batch["special_tokens_mask"], ignore_unmasked=ignore_unmasked)
        return ids, labels

    def loss_fn(m, batch):
        ids, labels = masked(batch)
        return m(input_ids=ids, attention_mask=batch["attention_mask"], labels=labels).loss

    def step(ctx, micro_batches):
        ctx.model.train()
        drawn = [masked(mb) for mb in micro_batches]
        n_items = sum(int((lab != -100).sum()) for _, lab in drawn)
        total = 0.0
        for mb, (ids, labels) in zip(micro_batches, drawn):
            logits = ctx.model(input_ids=ids, attention_mask=mb["attention_mask"]).logits
            loss = F.cross_entropy(logits.view(-1, VOCAB), labels.view(-1), ignore_index=-100, reduction="sum")
            (loss / max(n_items, 1)).backward()
            total += float(loss)
        torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), 1.0)
        ctx.optimizer.step()
        ctx.scheduler.step()
        ctx.optimizer.zero_grad()
        return torch.tensor(total / max(n_items, 1))

    def optimizer(m):
        no_decay = ("bias", "LayerNorm.weight")
        groups = [{"params": [p for n, p in m.named_parameters() if not any(x in n for x in no_decay)],
                   "weight_decay": 0.01},
                  {"params": [p for n, p in m.named_parameters() if any(x in n for x in no_decay)],
                   "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=3e-3)

    def scheduler(opt):
        return get_scheduler("linear", optimizer=opt, num_warmup_steps=2, num_training_steps=200)

    return tropt.Setup(model, loss_fn, optimizer, mlm_batches(), val_data=mlm_batches(1, seed=1),
                       scheduler=scheduler, step=step, accumulation_steps=k, grad_clip=1.0, num_classes=VOCAB)


def mlm_upstream_mean_setup() -> tropt.Setup:
    """The script as written: each micro-batch's masked-token mean divided by K (``loss /
    gradient_accumulation_steps``), the number of masked tokens differing per micro-batch."""
    s = mlm_setup()

    def step(ctx, micro_batches):
        ctx.model.train()
        for mb in micro_batches:
            (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
        torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), 1.0)
        ctx.optimizer.step()
        ctx.scheduler.step()
        ctx.optimizer.zero_grad()

    return s.replace(step=step)


# ====================================================================== 3. packed causal LM, gradient checkpointing
PACK_UP = "pytorch/torchtitan/torchtitan/train.py"
BLOCK = 16


def packed_blocks(n_batches: int = 4, batch: int = 8, seed: int = 0) -> list:
    """Documents of random length, each a +1 walk through the vocabulary from a random start, joined with EOS (id 2)
    into one stream and cut into fixed ``BLOCK``-token chunks: no padding, ``labels = input_ids``."""
    g = torch.Generator().manual_seed(seed)
    need = n_batches * batch * BLOCK
    stream: list[int] = []
    while len(stream) < need:
        length = int(torch.randint(3, 12, (1,), generator=g))
        start = int(torch.randint(0, VOCAB - FIRST, (1,), generator=g))
        stream += [int(x) for x in (start + torch.arange(length)) % (VOCAB - FIRST) + FIRST] + [SEP]
    blocks = torch.tensor(stream[:need]).view(-1, BLOCK)
    return [{"input_ids": b, "labels": b.clone()} for b in blocks.split(batch)]


def llama_model(*, checkpointing: bool = True, reentrant: bool | None = None):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=BLOCK, use_cache=False,
                      bos_token_id=SEP, eos_token_id=SEP, pad_token_id=PAD, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    if checkpointing:
        kwargs = None if reentrant is None else {"use_reentrant": reentrant}
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model


def packed_setup(*, frozen_embeddings: bool = False, zero_grad_each_micro: bool = False, k: int = 2) -> tropt.Setup:
    """torchtitan ``train.py`` on an HF model: packed fixed-length sequences (no padding, no attention mask),
    activation checkpointing (``model.gradient_checkpointing_enable()``), AdamW(lr, betas=(0.9, 0.95),
    weight_decay=0.1, eps=1e-8), a linear warm-up then cosine decay stepped per optimizer step, clipping to 1.0,
    ``loss / K`` per micro-batch (exact here: every micro-batch holds the same number of tokens).
    ``frozen_embeddings`` plants the PEFT-style bug: embeddings frozen under reentrant checkpointing, so no input of
    a checkpointed block requires grad and the blocks get no gradient (the documented "None of the inputs have
    requires_grad=True" case; the fix is ``model.enable_input_require_grads()``): transformers 5.24 no longer shows
    it (the checkpointed layers still get gradients), so it is kept only as a note. ``zero_grad_each_micro`` plants
    the accumulation bug: ``optimizer.zero_grad()`` inside the micro-batch loop, so only the last micro-batch's
    gradient (divided by K) reaches ``optimizer.step()``."""
    from transformers import get_cosine_schedule_with_warmup

    model = llama_model(reentrant=True if frozen_embeddings else None)
    if frozen_embeddings:
        model.model.embed_tokens.requires_grad_(False)

    def loss_fn(m, batch):
        return m(input_ids=batch["input_ids"], labels=batch["labels"]).loss

    def step(ctx, micro_batches):
        ctx.model.train()
        for mb in micro_batches:
            if zero_grad_each_micro:  # BUG: the previous micro-batches' gradients are dropped
                ctx.optimizer.zero_grad(set_to_none=True)
            (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
        torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), ctx.grad_clip)
        ctx.optimizer.step()
        ctx.scheduler.step()
        ctx.optimizer.zero_grad(set_to_none=True)

    def optimizer(m):
        return torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=3e-3, betas=(0.9, 0.95),
                                 weight_decay=0.1, eps=1e-8)

    def scheduler(opt):
        return get_cosine_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=200)

    return tropt.Setup(model, loss_fn, optimizer, packed_blocks(), val_data=packed_blocks(1, seed=1),
                       scheduler=scheduler, step=step, accumulation_steps=k, grad_clip=1.0, num_classes=VOCAB)


# ====================================================================== 4. sentence embeddings, in-batch negatives
ST_UP = "UKPLab/sentence-transformers/sentence_transformers/losses/MultipleNegativesRankingLoss.py"


class SentenceEncoder(nn.Module):
    """sentence-transformers' ``Transformer`` + ``Pooling(pooling_mode_mean_tokens=True)``: token embeddings averaged
    over the attention mask. ``ignore_mask`` plants the bug: padding positions averaged in too."""

    def __init__(self, ignore_mask: bool = False) -> None:
        super().__init__()
        from transformers import BertModel

        torch.manual_seed(0)
        self.bert = BertModel(bert_config(), add_pooling_layer=False)
        self.ignore_mask = ignore_mask

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        tokens = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        if self.ignore_mask:  # BUG: tokens.mean(1) counts the padding positions
            return tokens.mean(1)
        m = attention_mask.unsqueeze(-1).to(tokens.dtype)
        return (tokens * m).sum(1) / m.sum(1).clamp(min=1e-9)


def pad_right(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), n), PAD)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
    return ids, (ids != PAD).long()


def pair_batches(n_batches: int = 4, batch: int = 8, seed: int = 0) -> list:
    """(anchor, positive) pairs tokenized ``[CLS] w... [SEP]`` and padded to each batch's longest (the
    sentence-transformers collator's ``padding=True``): the positive is the anchor with one word changed, at another
    length."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        a_seqs, p_seqs = [], []
        for _ in range(batch):
            length = int(torch.randint(3, 9, (1,), generator=g))
            words = torch.randint(FIRST, VOCAB, (length,), generator=g).tolist()
            pos = list(words)
            pos[int(torch.randint(0, length, (1,), generator=g))] = int(torch.randint(FIRST, VOCAB, (1,),
                                                                                   generator=g))
            if torch.rand(1, generator=g) < 0.5:
                pos = pos[:-1] if len(pos) > 3 else [*pos, FIRST]
            a_seqs.append([CLS, *words, SEP])
            p_seqs.append([CLS, *pos, SEP])
        a_ids, a_mask = pad_right(a_seqs)
        p_ids, p_mask = pad_right(p_seqs)
        out.append({"anchor_input_ids": a_ids, "anchor_attention_mask": a_mask,
                    "positive_input_ids": p_ids, "positive_attention_mask": p_mask})
    return out


def mnrl_loss(model: nn.Module, batch: dict, scale: float = 20.0) -> torch.Tensor:
    """``MultipleNegativesRankingLoss``: cosine similarities of every anchor with every positive, times ``scale``,
    cross-entropy against the diagonal (the other positives of the batch are the negatives)."""
    a = model(batch["anchor_input_ids"], batch["anchor_attention_mask"])
    p = model(batch["positive_input_ids"], batch["positive_attention_mask"])
    scores = F.normalize(a, dim=-1) @ F.normalize(p, dim=-1).T * scale
    return F.cross_entropy(scores, torch.arange(len(a), device=a.device))


def join_padded_pairs(batches: list) -> dict:
    """Loader batches padded to their own longest, joined as the collator would have padded them together."""
    out = {}
    for key in batches[0]:
        n = max(b[key].shape[1] for b in batches)
        out[key] = torch.cat([F.pad(b[key], (0, n - b[key].shape[1]), value=0) for b in batches])
    return out


def st_setup(*, ignore_mask: bool = False) -> tropt.Setup:
    """sentence-transformers' ``SentenceTransformer.fit`` (v2, ``fit_mixin.py``) with ``MultipleNegativesRankingLoss``
    and ``Pooling`` mean tokens: AdamW(lr=2e-5 scaled up here, weight_decay=0.01 except bias and LayerNorm), a
    ``WarmupLinear`` schedule, ``max_grad_norm=1``, one loss per batch (no accumulation: in-batch negatives)."""
    from transformers import get_linear_schedule_with_warmup

    def optimizer(m):
        no_decay = ("bias", "LayerNorm.bias", "LayerNorm.weight")
        return torch.optim.AdamW(
            [{"params": [p for n, p in m.named_parameters() if not any(x in n for x in no_decay)],
              "weight_decay": 0.01},
             {"params": [p for n, p in m.named_parameters() if any(x in n for x in no_decay)],
              "weight_decay": 0.0}], lr=2e-3)

    def scheduler(opt):
        return get_linear_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=200)

    return tropt.Setup(SentenceEncoder(ignore_mask), mnrl_loss, optimizer, pair_batches(),
                       val_data=pair_batches(1, seed=1), scheduler=scheduler, grad_clip=1.0,
                       join_fn=join_padded_pairs)


# ====================================================================== 5. token classification (NER)
NER_UP = "huggingface/transformers/examples/pytorch/token-classification/run_ner_no_trainer.py"
TAGS = 5  # O, B-X, I-X, B-Y, I-Y


def ner_batches(n_batches: int = 4, batch: int = 8, seed: int = 0) -> list:
    """Words split into 1-3 subwords; ``tokenize_and_align_labels(label_all_tokens=False)``: the first subword of a
    word carries its tag, continuations and [CLS]/[SEP] carry -100
    padded per batch (the collator pads labels with
    -100). A word's tag is a function of its id (learnable)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        seqs, labs = [], []
        for _ in range(batch):
            n_words = int(torch.randint(2, 6, (1,), generator=g))
            ids, tags = [CLS], [-100]
            for _ in range(n_words):
                w = int(torch.randint(FIRST, VOCAB, (1,), generator=g))
                pieces = int(torch.randint(1, 4, (1,), generator=g))
                ids += [w] + [FIRST + (w + j) % (VOCAB - FIRST) for j in range(1, pieces)]
                tags += [w % TAGS] + [-100] * (pieces - 1)
            seqs.append([*ids, SEP])
            labs.append([*tags, -100])
        ids, mask = pad_right(seqs)
        labels = torch.full(ids.shape, -100)
        for i, t in enumerate(labs):
            labels[i, :len(t)] = torch.tensor(t)
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return out


def join_padded_tokens(batches: list) -> dict:
    out = {}
    for key in batches[0]:
        n = max(b[key].shape[1] for b in batches)
        fill = -100 if key == "labels" else 0
        out[key] = torch.cat([F.pad(b[key], (0, n - b[key].shape[1]), value=fill) for b in batches])
    return out


def token_accuracy(model: nn.Module, data: list) -> float:
    """run_ner's evaluation reduced to token accuracy (seqeval's input): argmax at labelled positions only."""
    model.eval()
    right = total = 0
    with torch.no_grad():
        for b in data:
            pred = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.argmax(-1)
            keep = b["labels"] != -100
            right += int((pred[keep] == b["labels"][keep]).sum())
            total += int(keep.sum())
    model.train()
    return right / max(total, 1)


def ner_setup(*, per_batch_mean: bool = False, k: int = 2, metric: bool = False) -> tropt.Setup:
    """transformers ``run_ner_no_trainer.py``: a random-init ``BertForTokenClassification``, ``DataCollatorFor
    TokenClassification`` (labels padded with -100), AdamW decay / no-decay groups, a linear schedule, token CE with
    ``ignore_index=-100``. Accumulation normalised by the cycle's labelled tokens (as the Trainer's
    ``num_items_in_batch``); ``per_batch_mean`` plants the script's own ``loss / gradient_accumulation_steps`` of
    per-micro-batch means (transformers issue #34263 / the Oct 2024 "gradient accumulation bug")."""
    from transformers import BertForTokenClassification, get_scheduler

    torch.manual_seed(0)
    model = BertForTokenClassification(bert_config(num_labels=TAGS))

    def loss_fn(m, batch):
        return m(**batch).loss

    def step(ctx, micro_batches):
        ctx.model.train()
        n_items = sum(int((mb["labels"] != -100).sum()) for mb in micro_batches)
        for mb in micro_batches:
            if per_batch_mean:  # BUG: mean over this micro-batch's tokens, then / K
                loss = ctx.loss_fn(ctx.model, mb) / len(micro_batches)
            else:
                logits = ctx.model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"]).logits
                loss = F.cross_entropy(logits.reshape(-1, TAGS), mb["labels"].reshape(-1), ignore_index=-100,
                                       reduction="sum") / n_items
            loss.backward()
        ctx.optimizer.step()
        ctx.scheduler.step()
        ctx.optimizer.zero_grad()

    def optimizer(m):
        no_decay = ("bias", "LayerNorm.weight")
        return torch.optim.AdamW(
            [{"params": [p for n, p in m.named_parameters() if not any(x in n for x in no_decay)],
              "weight_decay": 0.01},
             {"params": [p for n, p in m.named_parameters() if any(x in n for x in no_decay)],
              "weight_decay": 0.0}], lr=3e-3)

    def scheduler(opt):
        return get_scheduler("linear", optimizer=opt, num_warmup_steps=0, num_training_steps=200)

    return tropt.Setup(model, loss_fn, optimizer, ner_batches(), val_data=ner_batches(3, seed=1),
                       scheduler=scheduler, step=step, accumulation_steps=k, num_classes=TAGS,
                       join_fn=join_padded_tokens,
                       metric=tropt.Metric(token_accuracy, higher_is_better=True) if metric else None)


PORTS = [
    Port("bert_seqcls_hf_trainer", "nlp", SC_UP, bert_trainer_setup, needs=("transformers", "tokenizers"), bugs=(
        Bug("trainer_skips_ga_division_for_kwargs_heads", "loop.accumulation", ("summed",),
            lambda: bert_trainer_setup(as_shipped=True), source="transformers issue #47688"),
        # flagged today, but with the item-count cause; "reads the padding" is what fix_4.diff names
        Bug("collator_drops_attention_mask", "loop.accumulation", ("reads the padding",),
            lambda: bert_trainer_setup(no_mask=True),
            source="transformers modeling_utils warn_if_padding_and_no_attention_mask"),),
        notes={"dynamics.loss_curve": "overfitting WARN on 64 generated sentences"}),
    Port("bert_mlm_pretraining", "nlp", MLM_UP, mlm_setup, needs=("transformers",),
         notes={"model.overfit_batch": "slow: 15% masking of a tiny BERT", "dynamics.lr_range": "no clear drop"}),
    Port("llama_packed_grad_ckpt", "nlp", PACK_UP, packed_setup, needs=("transformers",), bugs=(
        Bug("zero_grad_inside_micro_loop", "loop.accumulation", ("cleared inside the micro-batch loop",),
            lambda: packed_setup(zero_grad_each_micro=True),
            source="PyTorch forums: gradient accumulation with zero_grad in the inner loop"),)),
    Port("sentence_transformers_mnrl", "nlp", ST_UP, st_setup, needs=("transformers",),
         notes={"loop.accumulation": "latent: in-batch negatives", "loop.ddp": "in-batch negatives per process"}),
    Port("bert_ner_token_cls", "nlp", NER_UP, ner_setup, needs=("transformers",), bugs=(
        Bug("ner_mean_per_microbatch", "loop.accumulation", ("its own item count",),
            lambda: ner_setup(per_batch_mean=True), source="transformers issue #34263"),),
         notes={"loop.ddp": "latent: each process would normalise by its own token count"}),
]

# Healthy variants that tropt (as of this probe) FAILs or ERRORs: the false alarms of REPORT.md.
FALSE_ALARM_CASES = {
    "trainer_short_schedule (dynamics.loss_curve FAIL flat; fix_1)": lambda: bert_trainer_setup(max_steps=40),
    "ner_dynamic_padding (model.init_loss ERROR; fix_2)": ner_setup,
    "ner_with_metric (model.eval_metric ERROR; fix_2)": lambda: ner_setup(metric=True),
}

# Planted bugs no check flags (REPORT.md says why); kept out of PORTS so the corpus stays green.
KNOWN_MISSES = (
    Bug("mlm_labels_not_ignored", "model.init_loss", ("-100",), lambda: mlm_setup(ignore_unmasked=False),
        source="DataCollatorForLanguageModeling: labels[~masked_indices] = -100"),
    Bug("mlm_loss_mean_per_microbatch", "loop.accumulation", ("its own item count",), mlm_upstream_mean_setup,
        source="transformers issue #34263 (hidden in the stochastic step's noise floor)"),
    Bug("mean_pooling_counts_padding", "loop.accumulation", ("reads the padding",),
        lambda: st_setup(ignore_mask=True), source="sentence-transformers Pooling: attention-mask weighted mean"),
    Bug("reentrant_ckpt_frozen_embeddings", "model.gradient_flow", ("checkpoint",),
        lambda: packed_setup(frozen_embeddings=True),
        source="peft enable_input_require_grads (no longer reproduces on transformers 5.24)"),
)
