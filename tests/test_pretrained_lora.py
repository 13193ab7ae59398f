"""Pretrained Hugging Face models given by where they are stored, fine-tuned with LoRA: the base
loaded by the executors, only the adapters on the wire, each fit exactly the single-process
transformers + peft reference on the same union batches."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from models import make_rdd
from sparkdl import BatchPlan, DistriOptimizer, InvalidArgumentError
from sparkdl.adapters import PretrainedModel, huggingface_step
from sparkdl.adapters.pretrained import shipped_model, trainable_parameters
from sparkdl.triggers import MaxIteration
from test_training_step import reference

import peft  # noqa: E402  (in the test install)
from peft import LoraConfig  # noqa: E402

SIZES, BATCH, SEED, ITERATIONS, VOCAB, LENGTH = [30, 14, 22], 12, 4, 4, 40, 8
TOL = 1e-5


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    """A tiny BERT-like sequence classifier and a tiny Llama-like causal LM, each saved with
    save_pretrained (nothing downloaded)."""
    from transformers import (BertConfig, BertForSequenceClassification, LlamaConfig,
                              LlamaForCausalLM)

    root = tmp_path_factory.mktemp("pretrained")
    torch.manual_seed(0)
    BertForSequenceClassification(BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=24, max_position_embeddings=16, num_labels=3,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).save_pretrained(root / "bert")
    LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=24, max_position_embeddings=16,
        tie_word_embeddings=False)).save_pretrained(root / "llama")
    return {"bert": str(root / "bert"), "llama": str(root / "llama")}


def bert_model(path, r=4):
    return PretrainedModel(path, "AutoModelForSequenceClassification", peft_config=LoraConfig(
        r=r, lora_alpha=8, target_modules=["query", "value"], modules_to_save=["classifier"]))


def llama_model(path, r=4):
    return PretrainedModel(path, "AutoModelForCausalLM", peft_config=LoraConfig(
        r=r, lora_alpha=8, target_modules=["q_proj", "v_proj"]))


def token_rows(n, seed=0):
    """Right-padded token ids, their masks, a class label (from the first token) and causal LM
    labels (-100 on the padding)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, (n, LENGTH))
    lengths = rng.integers(2, LENGTH + 1, n)
    mask = (np.arange(LENGTH)[None, :] < lengths[:, None]).astype(np.int64)
    ids = (ids * mask).astype(np.int64)
    lm_labels = np.where(mask == 1, ids, -100).astype(np.int64)
    return ids, mask, (ids[:, 0] % 3).astype(np.int64), lm_labels


def single_process(pretrained, seed):
    """What a peft user writes: from_pretrained, torch.manual_seed(seed), get_peft_model."""
    cls = pretrained.model_class()
    base = cls.from_pretrained(pretrained.path)
    torch.manual_seed(seed)
    return peft.get_peft_model(base, copy.deepcopy(pretrained.peft_config))


def adamw(params):
    return torch.optim.AdamW(params, lr=1e-2)


def trained_values(model):
    return {n: p.detach().clone() for n, p in trainable_parameters(model)}


@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_lora_fit_equals_single_process_peft_with_the_base_off_the_driver(sc, bases, kind):
    ids, mask, labels, lm_labels = token_rows(sum(SIZES))
    target = labels if kind == "bert" else lm_labels
    pretrained = (bert_model if kind == "bert" else llama_model)(bases[kind])
    step = huggingface_step(("input_ids", "attention_mask"))
    records = [((i, m), y) for i, m, y in zip(ids, mask, target)]
    opt = DistriOptimizer(pretrained, make_rdd(sc, records, SIZES), optimizer=adamw,
                          batch_size=BATCH, end_trigger=MaxIteration(ITERATIONS), seed=SEED,
                          training_step=step)
    driver = opt.model
    start = trained_values(driver)
    frozen = [n for n, p in driver.named_parameters() if not p.requires_grad]
    assert frozen and all(p.is_meta for n, p in driver.named_parameters() if n in frozen)
    # the adapters the driver made are bitwise those an executor makes with the fit's seed
    executor = pretrained.executor_model(SEED)
    assert all(torch.equal(v, dict(executor.named_parameters())[n]) for n, v in start.items())
    # what ships: the trainable tensors and the description, never the base
    from pyspark import cloudpickle

    trainable_bytes = sum(p.numel() * p.element_size() for p in start.values())
    base_bytes = sum(p.numel() * p.element_size() for p in executor.parameters())
    assert len(cloudpickle.dumps(shipped_model(driver))) < trainable_bytes + 16_384 < base_bytes
    assert opt.fit.layout.size == sum(p.numel() for p in start.values())
    trained = opt.optimize()
    assert trained is driver and type(trained).__name__.startswith("PeftModel")
    expected = single_process(pretrained, SEED)
    plan = BatchPlan(SIZES, BATCH, SEED, True)
    ref_start = {n: p.detach().clone() for n, p in expected.named_parameters()}
    reference(expected, [ids, mask], target, step, plan, ITERATIONS,
              adamw([p for p in expected.parameters() if p.requires_grad]))
    after = dict(expected.named_parameters())
    for name, value in trained_values(trained).items():
        assert float((value - after[name].detach()).abs().max()) <= TOL, name
    # only the adapters (and the head modules_to_save copies) changed in the reference too
    changed = {n for n, p in after.items() if not torch.equal(p.detach(), ref_start[n])}
    assert changed == set(start)


@pytest.fixture(scope="module")
def bert_fit(spark, bases):
    """NNClassifier(model=PretrainedModel(...)) fitted on columns of token ids (one partition),
    with the DataFrame and its arrays."""
    from sparkdl import NNClassifier

    ids, mask, labels, _ = token_rows(36, seed=3)
    rows = [(i.tolist(), m.tolist(), int(y)) for i, m, y in zip(ids, mask, labels)]
    df = spark.createDataFrame(rows, ["input_ids", "attention_mask", "label"]).coalesce(1)
    step = huggingface_step(("input_ids", "attention_mask"))
    clf = NNClassifier(model=bert_model(bases["bert"]), trainingStep=step,
                       inputCols=["input_ids", "attention_mask"], labelCol="label",
                       optimizer="adamw", learningRate=0.01, batchSize=12, maxEpoch=1, seed=2,
                       progressBar=False, numTrainWorkers=1)
    return clf.fit(df), df, ids, mask, labels


def probabilities(model, df):
    return np.stack(model.transform(df).select("probability").toPandas()["probability"]
                    .map(lambda v: v.toArray()))


def peft_probabilities(model, ids, mask):
    model.eval()
    with torch.no_grad():
        return torch.softmax(model(torch.from_numpy(ids), torch.from_numpy(mask)).logits,
                             -1).numpy()


def test_nnclassifier_lora_fit_is_the_engine_fit_and_transform_reads_the_adapters(bert_fit,
                                                                                  bases):
    """NNClassifier(model=PretrainedModel(...)) on columns of token ids: within 1e-5 of the
    single-process reference on the same union batches, the driver's base on the meta device,
    and transform's probabilities those of the reference model."""
    fitted, df, ids, mask, labels = bert_fit
    model = fitted.module
    step = huggingface_step(("input_ids", "attention_mask"))
    assert all(p.is_meta for p in model.parameters() if not p.requires_grad)
    expected = single_process(bert_model(bases["bert"]), 2)
    plan = BatchPlan([36], 12, 2, True)
    reference(expected, [ids, mask], labels, step, plan, 3,
              torch.optim.AdamW([p for p in expected.parameters() if p.requires_grad], lr=0.01,
                                weight_decay=0.0))
    after = dict(expected.named_parameters())
    for name, value in trained_values(model).items():
        assert float((value - after[name].detach()).abs().max()) <= TOL, name
    got = probabilities(fitted, df)
    assert np.abs(got - peft_probabilities(expected, ids, mask)).max() <= 1e-5


def test_a_saved_lora_fit_is_its_adapter_and_loads_back_to_the_same_predictions(
        bert_fit, bases, tmp_path):
    """save writes peft's adapter files and the base's reference (no base weights);
    NNClassifierModel.load, PeftModel.from_pretrained of the saved directory, transform of the
    loaded model and the merged model predict the same."""
    import json
    import os

    from transformers import BertForSequenceClassification

    from sparkdl import NNClassifierModel
    from sparkdl.storage.pretrained_files import base_identity

    fitted, df, ids, mask, _ = bert_fit
    saved = str(tmp_path / "saved")
    fitted.write().save(saved)
    names = set(os.listdir(saved))
    assert {"adapter_config.json", "adapter_model.safetensors", "sparkdl_base.json"} <= names
    assert "weights.pt" not in names
    base_bytes = os.path.getsize(os.path.join(bases["bert"], "model.safetensors"))
    assert os.path.getsize(os.path.join(saved, "adapter_model.safetensors")) < base_bytes / 3
    reference_ = json.load(open(os.path.join(saved, "sparkdl_base.json")))
    assert reference_["path"] == bases["bert"]
    assert reference_["identity"] == base_identity(bases["bert"])

    loaded = NNClassifierModel.load(saved)
    assert all(p.is_meta for p in loaded.module.parameters() if not p.requires_grad)
    ours, theirs = trained_values(fitted.module), trained_values(loaded.module)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    from_peft = peft.PeftModel.from_pretrained(
        BertForSequenceClassification.from_pretrained(bases["bert"]), saved)
    expected = peft_probabilities(from_peft, ids, mask)
    fitted_probs, loaded_probs = probabilities(fitted, df), probabilities(loaded, df)
    assert np.array_equal(fitted_probs, loaded_probs)
    assert np.abs(loaded_probs - expected).max() <= 1e-6
    merged = loaded.merged()
    assert type(merged) is BertForSequenceClassification
    assert np.abs(peft_probabilities(merged, ids, mask) - expected).max() <= 1e-5

    # a base that changed at its path is refused, naming the path
    with open(os.path.join(saved, "sparkdl_base.json"), "w") as out:
        json.dump(dict(reference_, path=bases["llama"]), out)
    with pytest.raises(InvalidArgumentError, match="is not the one this adapter was trained on"):
        NNClassifierModel.load(saved)


def test_mlflow_logs_the_adapter_as_artifacts(bert_fit, bases, tmp_path):
    """log_adapter logs peft's files and the base's reference as artifacts of the run; what
    is downloaded loads with PeftModel.from_pretrained and load_adapter, the adapters bitwise
    the fit's."""
    import mlflow
    from transformers import BertForSequenceClassification

    from sparkdl.ml.mlflow_models import log_adapter

    fitted, _, ids, mask, _ = bert_fit
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    try:
        experiment = mlflow.create_experiment("lora", artifact_location=str(tmp_path / "art"))
        with mlflow.start_run(experiment_id=experiment) as run:
            uri = log_adapter(fitted)
        listed = {a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id,
                                                                        "adapter")}
        assert {"adapter/adapter_config.json", "adapter/adapter_model.safetensors",
                "adapter/sparkdl_base.json"} <= listed
        local = mlflow.artifacts.download_artifacts(uri, dst_path=str(tmp_path / "down"))
    finally:
        mlflow.set_tracking_uri(previous)
    from_peft = peft.PeftModel.from_pretrained(
        BertForSequenceClassification.from_pretrained(bases["bert"]), local)
    assert all(torch.equal(v, dict(from_peft.named_parameters())[n])
               for n, v in trained_values(fitted.module).items())
    from sparkdl.adapters import load_adapter      # the driver's model again, base on meta

    again = load_adapter(local)
    assert all(p.is_meta for p in again.parameters() if not p.requires_grad)
    ours, theirs = trained_values(fitted.module), trained_values(again)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def _worker_loads(sc):
    """(pid, bases loaded) of the Python workers a small job reaches."""
    def loads(_):
        import os

        from sparkdl.adapters.pretrained import base_loads

        yield os.getpid(), base_loads()

    return dict(sc.parallelize(range(8), 8).mapPartitions(loads).collect())


def test_a_pass_of_three_lora_ranks_loads_the_base_once_per_worker_and_is_bitwise_each_fit(
        sc, bases):
    from sparkdl import FitSet

    ids, mask, _, lm_labels = token_rows(sum(SIZES), seed=5)
    records = [((i, m), y) for i, m, y in zip(ids, mask, lm_labels)]
    rdd = make_rdd(sc, records, SIZES).cache()
    step = huggingface_step(("input_ids", "attention_mask"))
    root = bases["llama"] + "-pass"
    import shutil

    shutil.copytree(bases["llama"], root)    # another file: a base by content no earlier
    with open(f"{root}/README.md", "w") as note:     # test loaded in these workers
        note.write("a copy\n")

    def fit(r):
        return DistriOptimizer(llama_model(root, r), rdd, optimizer=adamw, batch_size=BATCH,
                               end_trigger=MaxIteration(3), seed=SEED, training_step=step)

    before = _worker_loads(sc)
    together = [fit(r) for r in (2, 4, 8)]
    FitSet(together).run()
    after = _worker_loads(sc)
    new = {pid: n - before.get(pid, 0) for pid, n in after.items()}
    assert max(new.values()) == 1 and all(n in (0, 1) for n in new.values()), new
    for r, member in zip((2, 4, 8), together):
        alone = fit(r)
        alone.optimize()
        a, b = trained_values(member.model), trained_values(alone.model)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), r
    rdd.unpersist()


def test_pretrained_model_refuses_what_it_cannot_build_before_any_job(bases):
    with pytest.raises(InvalidArgumentError, match="init_lora_weights='pissa'"):
        PretrainedModel(bases["llama"], "AutoModelForCausalLM",
                        peft_config=LoraConfig(r=2, init_lora_weights="pissa"))
    with pytest.raises(InvalidArgumentError, match="use_dora"):
        PretrainedModel(bases["llama"], "AutoModelForCausalLM",
                        peft_config=LoraConfig(r=2, use_dora=True))
    with pytest.raises(InvalidArgumentError, match="device_map"):
        PretrainedModel(bases["llama"], "AutoModelForCausalLM", device_map="auto")
    with pytest.raises(InvalidArgumentError, match="no model class 'AutoModelForNothing'"):
        PretrainedModel(bases["llama"], "AutoModelForNothing").driver_model()
    with pytest.raises(InvalidArgumentError, match="no config.json"):
        PretrainedModel(bases["llama"] + "/missing", "AutoModelForCausalLM").driver_model()
    with pytest.raises(InvalidArgumentError, match="callable params"):
        DistriOptimizer(llama_model(bases["llama"]), None,
                        optimizer=torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1),
                        batch_size=4)


def test_base_identity_follows_content_not_path(bases, tmp_path):
    import shutil

    from sparkdl.storage.pretrained_files import base_identity

    copy_dir = tmp_path / "copy"
    shutil.copytree(bases["bert"], copy_dir)
    assert base_identity(str(copy_dir)) == base_identity(bases["bert"])
    assert base_identity(f"file://{copy_dir}") == base_identity(bases["bert"])
    from transformers import BertForSequenceClassification

    changed = BertForSequenceClassification.from_pretrained(str(copy_dir))
    with torch.no_grad():
        changed.classifier.bias.add_(1e-3)       # a small tensor: read whole
    changed.save_pretrained(copy_dir)
    assert base_identity(str(copy_dir)) != base_identity(bases["bert"])


@pytest.mark.cluster
def test_lora_fit_is_bitwise_through_a_failed_task_and_a_killed_executor(bases, tmp_path):
    """On local-cluster (two executors): a failed task and a killed executor in one fit give the
    undisturbed fit's adapters bitwise; the replacement executor loads the base itself, the
    surviving one keeps its cached base (which of the two trains after the kill is Spark's
    choice)."""
    import json
    import os
    import subprocess
    import sys

    markers, out = tmp_path / "markers", tmp_path / "trained.pt"
    markers.mkdir()
    job = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lora_cluster_job.py")
    proc = subprocess.run([sys.executable, job, "local-cluster[2,1,1024]", bases["llama"],
                           str(out), str(markers)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert (markers / "task").exists() and (markers / "executor").exists()
    assert "were retried by Spark" in proc.stderr
    assert "rebuilding all 4 of them from the RDD lineage" in proc.stderr
    printed = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    clean, faulted = json.loads(printed["clean_loads"]), json.loads(printed["faulted_loads"])
    assert sorted(clean.values()) == [1, 1], clean
    survivors, replacements = set(faulted) & set(clean), set(faulted) - set(clean)
    assert len(survivors) == 1 and len(replacements) == 1, (clean, faulted)
    # the survivor kept its base; the replacement loaded it itself if it trained, else not at all
    ran = set(json.loads(printed["task_executors"]))
    assert set(clean) <= ran and ran <= set(clean) | replacements, (ran, clean, faulted)
    assert faulted == {e: int(e in ran) for e in faulted}, (ran, faulted)
    assert printed["iterations"] == "6"
    trained = torch.load(out, weights_only=True)
    assert trained["clean"].keys() == trained["faulted"].keys()
    assert all(torch.equal(trained["clean"][k], trained["faulted"][k]) for k in trained["clean"])


def test_a_lora_fit_resumes_from_its_checkpoint_bitwise(sc, bases, tmp_path, caplog):
    """A checkpoint of a LoRA fit holds the trainable tensors and the base's reference, not
    the frozen weights; a longer run resumes from it to the undisturbed fit's adapters
    bitwise."""
    from sparkdl.triggers import SeveralIteration

    ids, mask, _, lm_labels = token_rows(sum(SIZES), seed=7)
    records = [((i, m), y) for i, m, y in zip(ids, mask, lm_labels)]
    rdd = make_rdd(sc, records, SIZES)
    step = huggingface_step(("input_ids", "attention_mask"))
    pretrained = llama_model(bases["llama"])

    def fit(iterations, checkpoint=None):
        opt = DistriOptimizer(pretrained, rdd, optimizer=adamw, batch_size=BATCH,
                              end_trigger=MaxIteration(iterations), seed=SEED,
                              training_step=step)
        if checkpoint is not None:
            opt.set_checkpoint(str(checkpoint), SeveralIteration(2))
        return trained_values(opt.optimize())

    whole = fit(4)
    fit(2, tmp_path / "ckpt")
    saved = torch.load(tmp_path / "ckpt" / "checkpoint-0000000002.pt", weights_only=False)
    assert set(saved["model_state"]) == set(whole)
    assert saved["pretrained_base"]["identity"] == pretrained.identity()
    with caplog.at_level("INFO", logger="sparkdl"):
        resumed = fit(4, tmp_path / "ckpt")
    assert "resuming from checkpoint" in caplog.text and "checkpoint-0000000002.pt" in caplog.text
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)


WORDS = [f"w{i}" for i in range(VOCAB - 2)]


def save_tokenizer(directory):
    """A word-level tokenizer over WORDS ([PAD] = 0, [UNK] = 1), built offline and saved with
    save_pretrained into ``directory`` (beside the model's files)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    core = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]",
                                        unk_token="[UNK]")
    tokenizer.save_pretrained(directory)
    return tokenizer


def texts(n, seed):
    """Texts of 1 to 12 words (some longer than LENGTH: truncated), a few unknown words."""
    rng = np.random.default_rng(seed)
    return [" ".join(WORDS[j] if j < len(WORDS) else "zz" for j in
                     rng.integers(0, len(WORDS) + 2, rng.integers(1, 13))) for _ in range(n)]


def test_a_text_column_tokenized_on_the_executors_trains_as_the_single_process_reference(
        spark, sc, bases, tmp_path):
    """tokenize_column in the tasks gives the single-process tokenizer's ids, masks and -100
    labels row for row; a causal LM fit on them over three partitions is within 1e-5 of the
    reference that tokenizes the same union batches (token-mean over the union batch)."""
    import shutil

    from sparkdl.adapters import tokenize_column
    from sparkdl.adapters.tokenization import tokenize_texts

    model_dir = tmp_path / "llama-text"
    shutil.copytree(bases["llama"], model_dir)
    tokenizer = save_tokenizer(model_dir)
    corpus = texts(sum(SIZES), seed=8)
    rows = sc.parallelize(list(enumerate(corpus)), 3).toDF(["row", "text"])
    tokens = tokenize_column(rows, "text", str(model_dir), max_length=LENGTH, labels=True)
    assert tokens.columns == ["row", "text", "input_ids", "attention_mask", "labels"]
    local = tokens.toPandas()
    expected = tokenize_texts(tokenizer, corpus, LENGTH, labels=True)
    assert local["row"].tolist() == list(range(len(corpus)))
    for name in ("input_ids", "attention_mask", "labels"):
        assert np.array_equal(np.stack(local[name]), expected[name]), name
    assert (expected["labels"] == -100).any() and expected["attention_mask"].all(1).any()

    records = tokens.rdd.map(lambda r: ((np.array(r.input_ids), np.array(r.attention_mask)),
                                        np.array(r.labels)))
    sizes = records.glom().map(len).collect()
    step = huggingface_step(("input_ids", "attention_mask"))
    pretrained = llama_model(str(model_dir))
    opt = DistriOptimizer(pretrained, records, optimizer=adamw, batch_size=BATCH,
                          end_trigger=MaxIteration(3), seed=SEED, training_step=step)
    trained = trained_values(opt.optimize())
    ref = single_process(pretrained, SEED)
    plan = BatchPlan(sizes, BATCH, SEED, True)
    optimizer = adamw([p for p in ref.parameters() if p.requires_grad])
    for t in range(3):       # the reference tokenizes each union batch's texts itself
        idx = plan.global_indices(*plan.epoch_and_step(t))
        batch = tokenize_texts(tokenizer, [corpus[j] for j in idx], LENGTH, labels=True)
        optimizer.zero_grad()
        total, count = step(ref, [torch.from_numpy(batch["input_ids"]),
                                  torch.from_numpy(batch["attention_mask"])],
                            torch.from_numpy(batch["labels"]))
        (total / count).backward()
        optimizer.step()
    after = dict(ref.named_parameters())
    for name, value in trained.items():
        assert float((value - after[name].detach()).abs().max()) <= TOL, name


def test_tokenize_column_refuses_what_it_cannot_tokenize_before_any_job(spark, bases):
    from sparkdl.adapters import tokenize_column

    df = spark.createDataFrame([(1, "w1 w2")], ["n", "text"])
    with pytest.raises(InvalidArgumentError, match="no column 'body'"):
        tokenize_column(df, "body", bases["llama"], max_length=4)
    with pytest.raises(InvalidArgumentError, match="'n' must be a string column"):
        tokenize_column(df, "n", bases["llama"], max_length=4)
    with pytest.raises(InvalidArgumentError, match="padding='longest'"):
        tokenize_column(df, "text", bases["llama"], max_length=4, padding="longest")
    with pytest.raises(InvalidArgumentError, match="max_length must be a positive int"):
        tokenize_column(df, "text", bases["llama"], max_length=0)


def test_a_pretrained_model_without_peft_config_trains_whole_as_from_pretrained(sc, bases):
    """No peft config: every weight trains (and travels), within 1e-5 of from_pretrained
    trained in one process."""
    ids, mask, _, lm_labels = token_rows(sum(SIZES), seed=9)
    records = [((i, m), y) for i, m, y in zip(ids, mask, lm_labels)]
    step = huggingface_step(("input_ids", "attention_mask"))
    pretrained = PretrainedModel(bases["llama"], "AutoModelForCausalLM")
    opt = DistriOptimizer(pretrained, make_rdd(sc, records, SIZES), optimizer=adamw,
                          batch_size=BATCH, end_trigger=MaxIteration(2), seed=SEED,
                          training_step=step)
    trained = trained_values(opt.optimize())
    expected = pretrained.model_class().from_pretrained(bases["llama"])
    assert set(trained) == {n for n, _ in expected.named_parameters()}
    reference(expected, [ids, mask], lm_labels, step, BatchPlan(SIZES, BATCH, SEED, True), 2,
              adamw(expected.parameters()))
    after = dict(expected.named_parameters())
    for name, value in trained.items():
        assert float((value - after[name].detach()).abs().max()) <= TOL, name
